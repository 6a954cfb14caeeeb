"""The mechanism registry: every name round-trips, builds its noise class, and bad names are named."""

import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import banded, blt, files, gaussian, registry, square_root, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

STRATEGIES = {
    'gaussian': gaussian.GaussianStrategy(),
    'tree': tree.TreeStrategy('vanilla'),
    'tree_efficient': tree.TreeStrategy('efficient'),
    'tree_full': tree.TreeStrategy('full'),
    'banded': banded.BandedStrategy.from_toeplitz([1.0, 0.5], num_rounds=6),
    'blt': blt.BLTStrategy(theta=(0.9, 0.4), omega=(0.3, 0.1)),
    'bsr': square_root.BandedSquareRootStrategy(num_bands=3),
    'bisr': square_root.BandedInverseSquareRootStrategy(num_bands=3),
}


def _assert_same(a, b):
  """Strategies are equal when their configs are (banded configs hold arrays)."""
  config_a, config_b = a.to_config(), b.to_config()
  assert sorted(config_a) == sorted(config_b)
  for key, value in config_a.items():
    np.testing.assert_array_equal(value, config_b[key])


def test_every_mechanism_is_registered_once():
  assert sorted(registry.names()) == sorted(STRATEGIES)
  assert 'tree_full' not in registry.names(streaming_only=True)


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_config_and_file_round_trip(name, tmp_path):
  strategy = STRATEGIES[name]
  assert strategy.name == name
  assert isinstance(strategy, registry.strategy_class(name))
  _assert_same(registry.strategy_from_config(strategy.to_config()), strategy)
  path = tmp_path / f'strategy{registry.entry(name).file_suffix}'
  files.save_strategy(strategy, path)
  _assert_same(files.load_strategy(path), strategy)
  # The accountant's view is the strategy's own: sensitivity under a schema.
  schema = participation_lib.ParticipationSchema(min_sep=2, max_participations=2)
  assert strategy.sensitivity_squared(6, schema) > 0


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_default_strategy_only_for_parameter_free(name):
  if registry.entry(name).needs_parameters:
    with pytest.raises(ValueError, match='parameters'):
      registry.default_strategy(name)
    assert callable(registry.optimizer(name))
  else:
    assert registry.default_strategy(name) == STRATEGIES[name]
    with pytest.raises(ValueError, match='optimizer'):
      registry.optimizer(name)


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_noise_class_streams_the_strategy(name):
  if not registry.entry(name).streams:
    with pytest.raises(ValueError, match='streaming'):
      registry.noise_class(name)
    return
  from dp_ftrl_tff.noise import base as noise_base
  noise = registry.noise_class(name).from_strategy(STRATEGIES[name])
  assert isinstance(noise, noise_base.StreamingNoise)
  assert np.all(np.isfinite(STRATEGIES[name].noise_matrix(4)))


def test_bad_names_and_configs_are_named():
  with pytest.raises(ValueError, match='mechanism'):
    registry.entry('bandmf')
  with pytest.raises(ValueError, match='config'):
    registry.strategy_from_config('blt')
  with pytest.raises(ValueError, match='mechanism'):
    registry.strategy_from_config({'theta': [0.5]})
  assert isinstance(registry.strategy_from_config({'mechanism': 'tree_full'}), tree.TreeStrategy)


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_segments_sensitivity_against_dense_block_diagonal(name):
  """Every strategy's restart accounting vs brute force over the patterns of block-diagonal C."""
  import scipy.linalg
  strategy = STRATEGIES[name]
  lengths = [3, 3]
  schema = participation_lib.ParticipationSchema(min_sep=2, max_participations=2)
  blocks = [strategy.strategy_matrix(length) for length in lengths]
  if name == 'gaussian':  # C = I whatever the restarts.
    blocks = [np.eye(sum(lengths))]
  c = scipy.linalg.block_diag(*blocks)
  assert np.all(c.T @ c >= -1e-12)  # Non-negative Gram: the max is over 0/1 patterns.
  dense = max(np.sum(c[:, list(p)].sum(axis=1)**2) for p in patterns_lib.all_patterns(schema, sum(lengths)))
  accounted = strategy.segments_sensitivity_squared(lengths, schema)
  assert accounted >= dense * (1 - 1e-12)
  if strategy.segments_sensitivity_is_exact(lengths, schema):
    assert accounted == pytest.approx(dense, rel=1e-12)
  assert name not in ('gaussian', 'tree', 'tree_efficient', 'tree_full') or (
      strategy.segments_sensitivity_is_exact(lengths, schema))
