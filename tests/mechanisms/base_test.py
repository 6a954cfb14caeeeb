"""Tests for dp_ftrl_tff.mechanisms.base: workloads, decoder errors, config validation, exports."""

import types

import numpy as np
import pytest

import dp_ftrl_tff.mechanisms as mechanisms
from dp_ftrl_tff.mechanisms import banded, banded_optimizer, base, blt, files, gaussian, tree

pytestmark = pytest.mark.unit


def _momentum_by_impulses(n, momentum, learning_rates):
  """Column s of A: the model displacement theta_0 - theta_{t+1} when x = e_s, by the SGDM recursion."""
  a = np.zeros((n, n))
  for s in range(n):
    buffer, displacement = 0.0, 0.0
    for t in range(n):
      buffer = momentum * buffer + (1.0 if t == s else 0.0)  # m_t = beta m_{t-1} + x_t
      displacement += learning_rates[t] * buffer  # theta_{t+1} = theta_t - lr_t m_t
      a[t, s] = displacement
  return a


@pytest.mark.parametrize('momentum, learning_rates', [
    (0.9, None), (0.95, np.linspace(1.0, 0.1, 13)), (0.0, np.geomspace(1.0, 0.5, 13)), (0.5, None)])
def test_momentum_workload_matches_sgdm_recursion(momentum, learning_rates):
  n = 13
  rates = np.ones(n) if learning_rates is None else learning_rates
  np.testing.assert_allclose(base.momentum_workload(n, momentum, learning_rates),
                             _momentum_by_impulses(n, momentum, rates), rtol=1e-13, atol=0)


def test_momentum_workload_without_momentum_is_prefix_sums():
  np.testing.assert_array_equal(base.momentum_workload(6, 0.0), np.tril(np.ones((6, 6))))
  np.testing.assert_array_equal(base.prefix_sum_workload(6), np.tril(np.ones((6, 6))))


@pytest.mark.parametrize('kwargs, name', [
    ({'num_rounds': 0, 'momentum': 0.9}, 'num_rounds'),
    ({'num_rounds': 4, 'momentum': 1.0}, 'momentum'),
    ({'num_rounds': 4, 'momentum': -0.1}, 'momentum'),
    ({'num_rounds': 4, 'momentum': float('nan')}, 'momentum'),
    ({'num_rounds': 4, 'momentum': 0.9, 'learning_rates': [1.0, 1.0, 1.0]}, 'learning_rates'),
    ({'num_rounds': 2, 'momentum': 0.9, 'learning_rates': [1.0, 0.0]}, 'learning_rates'),
    ({'num_rounds': 2, 'momentum': 0.9, 'learning_rates': [1.0, np.inf]}, 'learning_rates'),
    ({'num_rounds': 2, 'momentum': 0.9, 'learning_rates': ['a', 'b']}, 'learning_rates'),
])
def test_momentum_workload_rejects_bad_arguments(kwargs, name):
  with pytest.raises(ValueError, match=name):
    base.momentum_workload(**kwargs)


def test_prefix_sum_workload_and_decoder_errors_validate():
  with pytest.raises(ValueError, match='num_rounds'):
    base.prefix_sum_workload(0)
  with pytest.raises(ValueError, match='decoder_matrix'):
    base.errors_from_decoder(np.ones(3))
  # Rows of norm^2 1, 2, 3: MaxError sqrt(3), RmsError sqrt(2).
  assert base.errors_from_decoder(np.tril(np.ones((3, 3)))) == pytest.approx(
      (np.sqrt(3.0), np.sqrt(2.0)), rel=1e-15)


@pytest.mark.parametrize('config, kwargs, match', [
    (['gaussian'], {}, 'config'),
    ({}, {}, 'mechanism'),
    ({'mechanism': ['blt']}, {}, 'mechanism'),
    ({'mechanism': 'blt'}, {}, "mechanism` must be 'gaussian'"),
    ({'mechanism': 'tree_x'}, {'mechanisms': ('tree', 'tree_full')}, 'one of'),
    ({'mechanism': 'gaussian', 'extra': 1}, {}, r"Unknown keys .*\['extra'\]"),
    ({'mechanism': 'gaussian'}, {'required': ('theta',)}, '`theta` is missing'),
])
def test_check_config_rejects(config, kwargs, match):
  kwargs = {'mechanisms': ('gaussian',), **kwargs}
  with pytest.raises(ValueError, match=match):
    base.check_config(config, **kwargs)


def test_check_config_accepts_required_and_optional_keys():
  config = {'mechanism': 'tree_full', 'theta': 1, 'completion': True}
  assert base.check_config(config, ('tree', 'tree_full'), required=('theta',),
                           optional=('completion',)) == 'tree_full'
  assert base.check_config({'mechanism': 'tree'}, ('tree',), optional=('completion',)) == 'tree'


def test_package_exports_the_strategies():
  assert mechanisms.GaussianStrategy is gaussian.GaussianStrategy
  assert mechanisms.TreeStrategy is tree.TreeStrategy
  assert mechanisms.BandedStrategy is banded.BandedStrategy
  assert mechanisms.BLTStrategy is blt.BLTStrategy
  assert mechanisms.optimize_banded is banded_optimizer.optimize_banded
  assert mechanisms.optimize_blt is blt.optimize_blt
  assert mechanisms.load_strategy is files.load_strategy
  assert mechanisms.save_strategy is files.save_strategy
  assert mechanisms.momentum_workload is base.momentum_workload
  assert all(hasattr(mechanisms, name) for name in mechanisms.__all__)


def test_runtime_warnings_from_package_modules_are_errors():
  # pyproject.toml's filterwarnings: a RuntimeWarning issued from a dp_ftrl_tff module fails the
  # test. numpy attributes a ufunc's floating-point warning to the module of the calling frame.
  probe = types.ModuleType('dp_ftrl_tff.mechanisms._warnings_probe')
  code = 'import numpy as np\ndef divide(): return np.float64(0) / np.float64(0)'
  exec(code, probe.__dict__)  # pylint: disable=exec-used
  with pytest.raises(RuntimeWarning, match='invalid value'):
    probe.divide()
