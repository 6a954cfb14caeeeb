"""Tests for files: round trips of every mechanism, and validation of broken files."""

import hashlib
import json

import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import banded, base, blt, files, gaussian, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

P = participation_lib.ParticipationSchema
THETA = [0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778]
OMEGA = [0.0070314825502323835, 0.10613806907600574, 0.1898159060327625, 0.1966594748073734]
SETTING = {'num_rounds': 40, 'min_sep': 8, 'max_participations': 5, 'fixed_epoch': False,
           'error': 'max',
           'losses': {'max_loss': 1.5, 'rms_loss': 1.25, 'sensitivity_squared': 4.0}}


def _banded_strategy():
  c = np.tril(np.random.default_rng(0).uniform(0.1, 1.0, size=(12, 12)))
  c[np.subtract.outer(np.arange(12), np.arange(12)) >= 3] = 0.0
  return banded.BandedStrategy(c)


def _strategies():
  return [
      gaussian.GaussianStrategy(),
      tree.TreeStrategy('vanilla'),
      tree.TreeStrategy('efficient', completion=True),
      tree.TreeStrategy('full'),
      blt.BLTStrategy(theta=THETA, omega=OMEGA),
      _banded_strategy(),
  ]


@pytest.mark.parametrize('index,suffix', [(i, s) for i in range(6) for s in ('.json', '.npz')
                                          if (i, s) != (5, '.json')])  # banded: .npz only
def test_round_trip_preserves_matrices_and_losses(tmp_path, index, suffix):
  strategy = _strategies()[index]
  path = tmp_path / f'strategy{suffix}'
  files.save_strategy(strategy, path, setting=SETTING)
  loaded, setting = files.load_strategy_and_setting(path)
  assert type(loaded) is type(strategy)
  assert loaded.name == strategy.name
  assert setting == SETTING
  n = 12
  np.testing.assert_array_equal(loaded.strategy_matrix(n), strategy.strategy_matrix(n))
  np.testing.assert_array_equal(loaded.noise_matrix(n), strategy.noise_matrix(n))
  schema = P.b_min_sep(3, 3)
  assert loaded.losses(n, schema) == strategy.losses(n, schema)
  assert files.load_strategy(path).to_config().keys() == strategy.to_config().keys()


def test_blt_json_is_readable_and_exact(tmp_path):
  path = tmp_path / 'blt.json'
  files.save_strategy(blt.BLTStrategy(theta=THETA, omega=OMEGA), path)
  document = json.loads(path.read_text())
  assert document['mechanism'] == 'blt'
  assert document['theta'] == THETA  # bit-exact floats
  assert document['omega'] == OMEGA
  assert 'setting' not in document
  loaded, setting = files.load_strategy_and_setting(path)
  assert setting is None
  assert loaded.theta == tuple(THETA)


def test_setting_from_optimization_result(tmp_path):
  strategy = gaussian.GaussianStrategy()
  schema = P.b_min_sep(4, 2)
  result = base.OptimizationResult(strategy=strategy, losses=strategy.losses(10, schema),
                                   num_rounds=10, participation=schema, seconds=0.1,
                                   details={'error': 'rms'})
  path = tmp_path / 's.json'
  files.save_strategy(strategy, path, setting=result)
  _, setting = files.load_strategy_and_setting(path)
  assert setting['num_rounds'] == 10 and setting['min_sep'] == 4
  assert setting['max_participations'] == 2 and setting['error'] == 'rms'
  assert setting['losses']['sensitivity_squared'] == 2.0


def test_banded_json_is_refused(tmp_path):
  with pytest.raises(ValueError, match='npz'):
    files.save_strategy(_banded_strategy(), tmp_path / 'b.json')


def _write(tmp_path, document, name='s.json'):
  path = tmp_path / name
  path.write_text(json.dumps(document))
  return path


@pytest.mark.parametrize('document,field', [
    ({'theta': THETA, 'omega': OMEGA}, 'mechanism'),
    ({'mechanism': 'nope'}, 'mechanism'),
    ({'mechanism': ['blt']}, 'mechanism'),
    ({'name': 'blt', 'theta': THETA, 'omega': OMEGA}, 'mechanism'),  # the legacy key is gone
    ({'mechanism': 'blt', 'omega': OMEGA}, 'theta'),
    ({'mechanism': 'blt', 'theta': THETA}, 'omega'),
    ({'mechanism': 'blt', 'theta': THETA, 'omega': OMEGA[:2]}, 'omega'),
    ({'mechanism': 'blt', 'theta': [0.5, float('nan')], 'omega': [0.1, 0.1]}, 'theta'),
    ({'mechanism': 'blt', 'theta': [0.5, -0.2], 'omega': [0.1, 0.1]}, 'theta'),
    ({'mechanism': 'blt', 'theta': [0.5, 1.5], 'omega': [0.1, 0.1]}, 'theta'),
    ({'mechanism': 'blt', 'theta': [[0.5]], 'omega': [[0.1]]}, 'theta'),
    ({'mechanism': 'tree', 'completion': 'yes'}, 'completion'),
    ({'mechanism': 'gaussian', 'setting': {'num_rounds': 0}}, 'setting.num_rounds'),
    ({'mechanism': 'gaussian', 'setting': {'error': 'mean'}}, 'setting.error'),
    ({'mechanism': 'gaussian', 'setting': {'rounds': 3}}, 'setting'),
    ({'mechanism': 'gaussian', 'setting': {'losses': {'max_loss': 1.0}}}, 'setting.losses'),
    ({'mechanism': 'gaussian', 'setting': {'losses': {'max_loss': -1.0, 'rms_loss': 1.0,
                                                      'sensitivity_squared': 1.0}}},
     'setting.losses.max_loss'),
    ({'mechanism': 'gaussian', 'format_version': 7}, 'format_version'),
])
def test_bad_json_names_the_field(tmp_path, document, field):
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    files.load_strategy(_write(tmp_path, document))


@pytest.mark.parametrize('suffix', ['.json', '.npz'])
def test_blt_whose_inverse_has_a_negative_decay_is_accepted(tmp_path, suffix):
  # jax_privacy's BLT pair: theta_hat ~ (0.854, 0.402, -0.655), a stable inverse.
  strategy = blt.BLTStrategy(theta=(0.9, 0.5, 0.001), omega=(0.1, 0.2, 0.5))
  assert strategy.inverse()[0][-1] < 0
  path = tmp_path / f'negative_inverse_decay{suffix}'
  files.save_strategy(strategy, path, setting=SETTING)
  loaded, setting = files.load_strategy_and_setting(path)
  assert loaded == strategy and setting == SETTING
  assert files.read_strategy_file(path).strategy == strategy
  document = {'mechanism': 'blt', 'theta': [0.5], 'omega': [0.9]}  # theta_hat = -0.4
  assert files.load_strategy(_write(tmp_path, document)).inverse()[0].tolist() == [-0.4]


@pytest.mark.parametrize('theta, omega, match', [
    ([0.9], [-0.5], r'`theta_hat`.*\[1\.4.*outside \(-1, 1\]'),   # |theta_hat| > 1: 1.4
    ([0.5], [1.6], r'`theta_hat`.*outside \(-1, 1\]'),             # -1.1
    ([0.9, 0.5], [0.5, -0.6], r'`theta_hat`.*complex'),              # 0.75 +- 0.42i
])
def test_blt_whose_inverse_is_not_a_stable_blt_is_refused(tmp_path, theta, omega, match):
  path = _write(tmp_path, {'format_version': 1, 'mechanism': 'blt', 'theta': theta, 'omega': omega})
  with pytest.raises(ValueError, match=match):
    files.load_strategy(path)
  with pytest.raises(ValueError, match=match):
    files.read_strategy_file(path)
  with pytest.raises(ValueError, match=match):  # and it is never written
    files.save_strategy(blt.BLTStrategy(theta=theta, omega=omega), tmp_path / 'refused.json')
  assert not (tmp_path / 'refused.json').exists()


def test_unreadable_files(tmp_path):
  with pytest.raises(ValueError, match='path'):
    files.load_strategy(tmp_path / 'missing.json')
  bad = tmp_path / 'bad.json'
  bad.write_text('{not json')
  with pytest.raises(ValueError, match='path'):
    files.load_strategy(bad)
  with pytest.raises(ValueError, match='path'):
    files.load_strategy(_write(tmp_path, [1, 2]))
  garbage = tmp_path / 'bad.npz'
  garbage.write_bytes(b'not a zip')
  with pytest.raises(ValueError, match='path'):
    files.load_strategy(garbage)


def test_bad_npz_names_the_field(tmp_path):
  path = tmp_path / 'b.npz'
  files.save_strategy(_banded_strategy(), path)
  with np.load(path) as data:
    metadata = data['metadata']
    rows = np.array(data['config/band_rows'])
  np.savez(tmp_path / 'nometa.npz', **{'config/band_rows': rows})
  with pytest.raises(ValueError, match='metadata'):
    files.load_strategy(tmp_path / 'nometa.npz')
  nan_rows = rows.copy()
  nan_rows[3, 1] = np.nan
  np.savez(tmp_path / 'nan.npz', metadata=metadata, **{'config/band_rows': nan_rows})
  with pytest.raises(ValueError, match='band_rows'):
    files.load_strategy(tmp_path / 'nan.npz')
  np.savez(tmp_path / 'shape.npz', metadata=metadata, **{'config/band_rows': rows[0]})
  with pytest.raises(ValueError, match='band_rows'):
    files.load_strategy(tmp_path / 'shape.npz')
  np.savez(tmp_path / 'text.npz', metadata=metadata, **{'config/band_rows': np.array(['a'])})
  with pytest.raises(ValueError, match='band_rows'):
    files.load_strategy(tmp_path / 'text.npz')
  np.savez(tmp_path / 'missing.npz', metadata=metadata)
  with pytest.raises(ValueError, match='band_rows'):
    files.load_strategy(tmp_path / 'missing.npz')


def test_save_rejects_a_non_strategy():
  with pytest.raises(ValueError, match='strategy'):
    files.save_strategy('blt', 'x.json')


def test_setting_mismatches_compare_rounds_min_sep_and_effective_participations():
  run = participation_lib.RunSetting
  assert files.setting_mismatches(SETTING, run(40, P(8, 5))) == ()
  assert files.setting_mismatches(None, run(10, P(1))) == ()
  # k = None at n = 40, b = 8 is ceil(40 / 8) = 5 participations: the same effective setting.
  assert files.setting_mismatches(SETTING, run(40, P(8))) == ()
  assert files.setting_mismatches(SETTING, run(41, P(9, 4))) == (
      'num_rounds: optimized for 40, the run has 41', 'min_sep: optimized for 8, the run has 9',
      'max_participations: optimized for 5, the run has 4')
  # Unrecorded: not compared.
  assert files.setting_mismatches({'min_sep': 8}, run(100, P(8, 2))) == ()
  # Without a declared schema only the rounds are compared.
  assert files.setting_mismatches(SETTING, run(41)) == (
      'num_rounds: optimized for 40, the run has 41',)
  with pytest.raises(ValueError, match='num_rounds'):
    run(0, P(8))
  with pytest.raises(ValueError, match='`run` must be a RunSetting'):
    files.setting_mismatches(SETTING, 41)
  with pytest.raises(ValueError, match='`run` must be a RunSetting'):
    files.read_strategy_file('unread.json', (41, P(8)))


def test_file_sha256_is_the_digest_of_the_bytes(tmp_path):
  path = tmp_path / 'blt.json'
  files.save_strategy(blt.BLTStrategy(theta=THETA, omega=OMEGA), str(path), SETTING)
  assert files.file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
  with pytest.raises(ValueError, match='path'):
    files.file_sha256(tmp_path / 'missing.json')


def test_banded_file_with_an_overflowing_entry_is_refused(tmp_path):
  path = str(tmp_path / 'banded.npz')
  files.save_strategy(banded.BandedStrategy.from_toeplitz([1.0, 0.5], num_rounds=4), path)
  with np.load(path) as data:
    arrays = dict(data)
  arrays['config/band_rows'][2, 1] = 1e300
  np.savez(path, **arrays)
  # The binaries name the file (`resolve`: --mechanism_file PATH is corrupt ...).
  with pytest.raises(ValueError, match=r'band_rows.*1e\+300, above 1e\+100'):
    files.read_strategy_file(path)


def test_blt_omega_above_the_coefficient_bound_is_refused():
  with pytest.raises(ValueError, match=r'`omega` has an entry of magnitude 1e\+300'):
    blt.BLTStrategy(theta=(0.9,), omega=(1e300,))
