"""Tests for the `python -m experiments.mechanisms_cli` CLI: subprocess runs and in-process error cases."""

import json

import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import participation as participation_lib
from experiments import mechanisms_cli as cli
from tests.testing import binaries
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.e2e

P = participation_lib.ParticipationSchema
OPTIMIZE_BLT_KEYS = ['mechanism', 'rounds', 'min_sep', 'max_participations', 'num_buffers', 'theta',
                     'omega', 'max_loss', 'rms_loss', 'sensitivity_squared', 'seconds']
OPTIMIZE_BANDED_KEYS = ['mechanism', 'rounds', 'min_sep', 'max_participations', 'num_bands', 'max_loss',
                        'rms_loss', 'sensitivity_squared', 'seconds']
LOSS_KEYS = ['max_loss', 'rms_loss', 'sensitivity_squared']


def _run(*args):
  return binaries.run_process(binaries.MECH, args)


def _run_json(*args):
  proc = _run(*args, '--json')
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout)


def _dense_losses(c, n, schema):
  """Independent reference: B = A C^-1 densely, sensitivity by brute force (C >= 0 here)."""
  decoder = np.tril(np.ones((n, n))) @ np.linalg.inv(c)
  rows = np.sum(decoder**2, axis=1)
  sens_sq = max(np.sum(c[:, list(p)].sum(axis=1)**2) for p in patterns_lib.all_patterns(schema, n))
  return np.sqrt(rows.max() * sens_sq), np.sqrt(rows.mean() * sens_sq), sens_sq


def test_evaluate_gaussian_json():
  out = _run_json('evaluate', '--mechanism=gaussian', '--rounds=2052', '--min_sep=342',
                  '--max_participations=6')
  assert list(out) == ['mechanism', 'rounds', 'min_sep', 'max_participations'] + LOSS_KEYS
  assert out['rms_loss'] == pytest.approx(78.48, abs=0.005)  # BandMF Table 2, DP-SGD
  assert out['sensitivity_squared'] == 6


def test_evaluate_blt_against_dense_reference_and_table():
  theta, omega = [0.9, 0.5], [0.2, 0.25]
  n, b, k = 12, 3, 2
  out = _run_json('evaluate', '--mechanism=blt', f'--rounds={n}', f'--min_sep={b}',
                  f'--max_participations={k}', '--theta=0.9,0.5', '--omega=0.2,0.25')
  coefs = np.concatenate([[1.0], [sum(w * t**(i - 1) for t, w in zip(theta, omega, strict=False))
                                  for i in range(1, n)]])
  c = np.array([[coefs[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])
  max_loss, rms_loss, sens_sq = _dense_losses(c, n, P.b_min_sep(b, k))
  assert out['max_loss'] == pytest.approx(max_loss, rel=1e-10)
  assert out['rms_loss'] == pytest.approx(rms_loss, rel=1e-10)
  assert out['sensitivity_squared'] == pytest.approx(sens_sq, rel=1e-10)
  assert out['theta'] == theta and out['omega'] == omega
  table = _run('evaluate', '--mechanism=tree', '--rounds=8', '--min_sep=1',
               '--max_participations=1')
  assert table.returncode == 0
  assert table.stdout.splitlines()[0].split() == ['mechanism', 'tree']
  assert any(line.startswith('sensitivity_squared') for line in table.stdout.splitlines())


def test_optimize_blt_then_evaluate_file(tmp_path):
  path = tmp_path / 'blt.json'
  out = _run_json('optimize', '--mechanism=blt', '--rounds=64', '--min_sep=8',
                  '--max_participations=4', '--num_buffers=1', f'--output={path}')
  assert list(out) == OPTIMIZE_BLT_KEYS
  assert out['num_buffers'] == 1 and len(out['theta']) == 1
  assert out['max_participations'] == 4
  again = _run_json('evaluate', f'--mechanism_file={path}', '--rounds=64', '--min_sep=8',
                    '--max_participations=4')
  for key in LOSS_KEYS:
    assert again[key] == pytest.approx(out[key], rel=1e-12)
  assert json.loads(path.read_text())['setting']['num_rounds'] == 64


def test_optimize_banded_then_evaluate_file(tmp_path):
  path = tmp_path / 'banded.npz'
  out = _run_json('optimize', '--mechanism=banded', '--rounds=16', '--num_bands=4', '--min_sep=4',
                  f'--output={path}')
  assert list(out) == OPTIMIZE_BANDED_KEYS
  assert out['sensitivity_squared'] == pytest.approx(4.0)  # unit column norms, k_eff = 16 / 4
  again = _run_json('evaluate', '--mechanism=banded', f'--mechanism_file={path}', '--rounds=16',
                    '--min_sep=4')
  for key in LOSS_KEYS:
    assert again[key] == pytest.approx(out[key], rel=1e-12)


def test_subprocess_errors_are_one_line_without_traceback():
  for args, flag in [(['evaluate', '--mechanism=blt', '--rounds=0', '--min_sep=3'], '--rounds'),
                     (['optimize', '--mechanism=gaussian', '--rounds=10', '--min_sep=2'],
                      '--mechanism')]:
    proc = _run(*args)
    assert proc.returncode != 0
    assert proc.stdout == ''
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert flag in proc.stderr and 'Traceback' not in proc.stderr


@pytest.mark.unit
@pytest.mark.parametrize('args,flag', [
    (['evaluate', '--mechanism=tree', '--min_sep=3'], '--rounds'),
    (['evaluate', '--mechanism=tree', '--rounds=10'], '--min_sep'),
    (['evaluate', '--mechanism=tree', '--rounds=x', '--min_sep=1'], '--rounds'),
    (['evaluate', '--mechanism=tree', '--rounds=10', '--min_sep=0'], '--min_sep'),
    (['evaluate', '--mechanism=tree', '--rounds=10', '--min_sep=2', '--max_participations=0'],
     '--max_participations'),
    (['evaluate', '--mechanism=nope', '--rounds=10', '--min_sep=2'], '--mechanism'),
    (['evaluate', '--rounds=10', '--min_sep=2'], '--mechanism'),
    (['evaluate', '--mechanism=blt', '--rounds=10', '--min_sep=2'], '--theta'),
    (['evaluate', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--theta=0.5,0.4',
      '--omega=0.1'], '--theta'),
    (['evaluate', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--theta=a', '--omega=0.1'],
     '--theta'),
    (['evaluate', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--theta=1.5', '--omega=0.1'],
     '--theta'),
    (['evaluate', '--mechanism=banded', '--rounds=10', '--min_sep=2'], '--mechanism_file'),
    (['evaluate', '--mechanism=tree', '--rounds=10', '--min_sep=2', '--num_buffers=2'], '--num_buffers'),
    (['evaluate', '--mechanism_file=/nonexistent.json', '--rounds=10', '--min_sep=2'],
     '--mechanism_file'),
    (['evaluate', '--mechanism=tree', '--rounds=10', '--min_sep=2', '--fixed_epoch'],
     '--max_participations'),
    (['optimize', '--mechanism=banded', '--rounds=10', '--min_sep=2', '--num_bands=11'], '--num_bands'),
    (['optimize', '--mechanism=banded', '--rounds=10', '--min_sep=2', '--num_bands=2',
      '--output=x.json'], '--output'),
    (['optimize', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--num_bands=2'], '--num_bands'),
    (['optimize', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--num_buffers=0'], '--num_buffers'),
    (['optimize', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--error=mean'], '--error'),
    (['optimize', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--unknown=1'], 'unknown'),
    (['run', '--mechanism=blt', '--rounds=10', '--min_sep=2'], 'command'),
    (['--mechanism=blt', '--rounds=10', '--min_sep=2'], 'command'),
])
def test_errors_name_the_flag(capsys, args, flag):
  assert cli.main(['prog'] + args) == 2
  captured = capsys.readouterr()
  assert captured.out == ''
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('mechanisms: error: ')
  assert flag in lines[0]


@pytest.mark.unit
def test_evaluate_mechanism_must_match_file(tmp_path, capsys):
  path = tmp_path / 'g.json'
  path.write_text(json.dumps({'mechanism': 'gaussian'}))
  assert cli.main(['prog', 'evaluate', '--mechanism=blt', f'--mechanism_file={path}',
                   '--rounds=4', '--min_sep=1']) == 2
  assert '--mechanism' in capsys.readouterr().err
  assert cli.main(['prog', 'evaluate', f'--mechanism_file={path}', '--rounds=4', '--min_sep=2',
                   '--max_participations=2', '--fixed_epoch', '--json']) == 0
  out = json.loads(capsys.readouterr().out)
  assert out['sensitivity_squared'] == 2.0 and out['mechanism'] == 'gaussian'


@pytest.mark.unit
def test_banded_file_rounds_limit(tmp_path, capsys):
  path = tmp_path / 'b.npz'
  assert cli.main(['prog', 'optimize', '--mechanism=banded', '--rounds=6', '--num_bands=2',
                   '--min_sep=2', f'--output={path}']) == 0
  capsys.readouterr()
  assert cli.main(['prog', 'evaluate', f'--mechanism_file={path}', '--rounds=7',
                   '--min_sep=2']) == 2
  assert '--rounds' in capsys.readouterr().err


@pytest.mark.unit
def test_help_exits_zero(capsys):
  assert cli.main(['prog', '--help']) == 0
  assert 'optimize' in capsys.readouterr().out


def test_saved_bands_and_default_bands(tmp_path):
  path = tmp_path / 'banded.npz'
  assert cli.main(['prog', 'optimize', '--mechanism=banded', '--rounds=8', '--num_bands=2',
                   '--min_sep=2', f'--output={path}']) == 0
  assert cli.main(['prog', 'evaluate', f'--mechanism_file={path}', '--rounds=8', '--min_sep=2']) == 0
  # Without --num_bands, BandMF uses min(min_sep, rounds) bands (exact sensitivity).
  out = _run_json('optimize', '--mechanism=banded', '--rounds=8', '--min_sep=3')
  assert out['num_bands'] == 3


@pytest.mark.unit
@pytest.mark.parametrize('mechanism', ['bsr', 'bisr'])
def test_square_root_evaluate_optimize_and_errors(mechanism, tmp_path, capsys):
  """evaluate --num_bands against dense math and brute force; optimize builds the closed form with
  b-hat = min(min_sep, rounds) and saves it; --error and a missing --num_bands are usage errors."""
  n, b, k, bands = 12, 3, 2, 4
  argv = ['prog', 'evaluate', f'--mechanism={mechanism}', f'--rounds={n}', f'--min_sep={b}',
          f'--max_participations={k}', f'--num_bands={bands}', '--json']
  assert cli.main(argv) == 0
  out = json.loads(capsys.readouterr().out)
  sqrt_coefs = np.array([1.0, 0.5, 0.375, 0.3125])  # binom(2j, j) / 4^j
  banded_factor = np.array([[sqrt_coefs[i - j] if 0 <= i - j < bands else 0.0 for j in range(n)]
                            for i in range(n)])
  if mechanism == 'bsr':
    c = banded_factor
  else:  # C^-1 holds the coefficients of (1 - x)^(1/2): 1, -1/2, -1/8, -1/16
    inverse_coefs = np.array([1.0, -0.5, -0.125, -0.0625])
    c = np.linalg.inv(np.array([[inverse_coefs[i - j] if 0 <= i - j < bands else 0.0
                                 for j in range(n)] for i in range(n)]))
  max_loss, rms_loss, sens_sq = _dense_losses(c, n, P.b_min_sep(b, k))
  assert out['max_loss'] == pytest.approx(max_loss, rel=1e-10)
  assert out['rms_loss'] == pytest.approx(rms_loss, rel=1e-10)
  assert out['sensitivity_squared'] == pytest.approx(sens_sq, rel=1e-10)
  assert out['num_bands'] == bands

  path = tmp_path / f'{mechanism}.json'
  assert cli.main(['prog', 'optimize', f'--mechanism={mechanism}', f'--rounds={n}',
                   f'--min_sep={b}', f'--max_participations={k}', f'--output={path}',
                   '--json']) == 0
  built = json.loads(capsys.readouterr().out)
  assert built['num_bands'] == b
  assert cli.main(['prog', 'evaluate', f'--mechanism_file={path}', f'--rounds={n}',
                   f'--min_sep={b}', f'--max_participations={k}', '--json']) == 0
  again = json.loads(capsys.readouterr().out)
  for key in LOSS_KEYS:
    assert again[key] == pytest.approx(built[key], rel=1e-12)

  for args, flag in (([f'--num_bands={bands}', '--error=max'], '--error'), ([], '--num_bands')):
    command = 'optimize' if '--error=max' in args else 'evaluate'
    assert cli.main(['prog', command, f'--mechanism={mechanism}', '--rounds=10', '--min_sep=2',
                     *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0]


@pytest.mark.unit
def test_mechanism_options_and_strategy_setting_mismatch(tmp_path, capsys):
  """The mechanism flags no other test runs in this binary: --completion, --toeplitz, both
  --error values; `evaluate` takes a file made for any setting, and the binary has no
  --allow_strategy_setting_mismatch (the drivers' and the privacy report's)."""
  def main_json(*args):
    assert cli.main(['prog', *args, '--json']) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)

  tree = main_json('evaluate', '--mechanism=tree', '--completion', '--rounds=6', '--min_sep=2')
  plain = main_json('evaluate', '--mechanism=tree', '--rounds=6', '--min_sep=2')
  # 6 rounds: the completed tree over 8 leaves releases more nodes (a larger sensitivity).
  assert tree['sensitivity_squared'] > plain['sensitivity_squared']
  banded_file = str(tmp_path / 'banded.npz')
  out = main_json('optimize', '--mechanism=banded', '--rounds=8', '--min_sep=2', '--num_bands=2',
                  '--toeplitz', '--error=max', f'--output={banded_file}')
  assert out['num_bands'] == 2
  out = main_json('optimize', '--mechanism=blt', '--rounds=8', '--min_sep=2', '--num_buffers=1',
                  '--error=rms')
  assert out['num_buffers'] == 1
  # The banded file was optimized for min_sep 2; evaluating it for min_sep 4 is what `evaluate`
  # is for.
  other = main_json('evaluate', f'--mechanism_file={banded_file}', '--rounds=8', '--min_sep=4')
  assert other['min_sep'] == 4
  assert cli.main(['prog', 'evaluate', f'--mechanism_file={banded_file}', '--rounds=8',
                   '--min_sep=4', '--allow_strategy_setting_mismatch']) == 2
  assert "Unknown command line flag 'allow_strategy_setting_mismatch'" in capsys.readouterr().err
