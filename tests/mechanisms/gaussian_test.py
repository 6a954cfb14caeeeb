"""Tests for gaussian.GaussianStrategy against dense matrices and brute-force sensitivity."""

import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import base, gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

P = participation_lib.ParticipationSchema


@pytest.mark.parametrize('n', [1, 2, 7, 20])
def test_closed_form_errors_match_dense_decoder(n):
  strategy = gaussian.GaussianStrategy()
  decoder = base.prefix_sum_workload(n) @ strategy.noise_matrix(n)
  row_sq = np.sum(decoder**2, axis=1)
  max_error, rms_error = strategy.errors(n)
  assert max_error == pytest.approx(np.sqrt(row_sq.max()))
  assert rms_error == pytest.approx(np.sqrt(row_sq.mean()))
  np.testing.assert_array_equal(strategy.decoder_matrix(n), decoder)


@pytest.mark.parametrize('schema', [P.single(), P.b_min_sep(2, 3), P.b_min_sep(3),
                                    P.fixed_epoch_order(3, 2), P.fixed_epoch_order(5, 4)])
def test_sensitivity_is_largest_pattern_size(schema):
  n = 10
  strategy = gaussian.GaussianStrategy()
  c = strategy.strategy_matrix(n)
  brute = max(np.sum(c[:, list(p)].sum(axis=1)**2) for p in patterns_lib.all_patterns(schema, n))
  assert strategy.sensitivity_squared(n, schema) == brute


def test_config_round_trip_and_validation():
  strategy = gaussian.GaussianStrategy()
  config = strategy.to_config()
  assert config == {'mechanism': 'gaussian'}
  assert gaussian.GaussianStrategy.from_config(config) == strategy
  with pytest.raises(ValueError, match='mechanism'):
    gaussian.GaussianStrategy.from_config({'mechanism': 'blt'})
  with pytest.raises(ValueError, match='extra'):
    gaussian.GaussianStrategy.from_config({'mechanism': 'gaussian', 'extra': 1})
  with pytest.raises(ValueError, match='config'):
    gaussian.GaussianStrategy.from_config(['gaussian'])


def test_invalid_arguments():
  strategy = gaussian.GaussianStrategy()
  with pytest.raises(ValueError, match='num_rounds'):
    strategy.strategy_matrix(0)
  with pytest.raises(ValueError, match='participation'):
    strategy.sensitivity_squared(5, 'single')
  assert strategy.max_rounds is None
