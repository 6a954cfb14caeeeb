"""Tests of the equal-privacy comparison: noise multipliers at a common rho, losses at that noise."""

import dataclasses
import math

import numpy as np
import pytest

from dp_ftrl_tff.accounting import calibration, equal_privacy, zcdp, zcdp_epsilon
from dp_ftrl_tff.mechanisms import banded_optimizer, blt, registry, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns

pytestmark = pytest.mark.unit

P = participation_lib.ParticipationSchema


def _by_label(table):
  return {row.mechanism: row for row in table.rows}


@pytest.mark.slow  # about 15 s on an idle core (a PLD calibration and nine strategies at n = 2000)
def test_paper_scale_setting_ranks_blt_and_bandmf_below_dp_sgd():
  """n = 2000, min_sep 400, 5 participations, epsilon 8 at delta 1e-6 (the BLT paper's App. A)."""
  n, schema = 2000, P(400, 5)
  rho = calibration.rho_for_epsilon(8.0, 1e-6)
  table = equal_privacy.equal_privacy(n, schema, rho=rho,
                                      run_strategy=blt.PRODUCTION_STRATEGIES[400])
  rows = _by_label(table)
  assert not table.skipped
  dp_sgd = rows['gaussian']
  # DP-SGD independently: C = I, sens^2 = k, B = A with largest row norm^2 n and mean (n + 1) / 2.
  sigma = math.sqrt(5 / (2 * rho))
  assert dp_sgd.noise_multiplier == pytest.approx(sigma, rel=1e-12)
  assert dp_sgd.max_loss == pytest.approx(sigma * math.sqrt(n), rel=1e-12)
  assert dp_sgd.rms_loss == pytest.approx(sigma * math.sqrt((n + 1) / 2), rel=1e-12)
  correlated = [row for label, row in rows.items() if label.startswith(('blt', 'banded'))]
  assert len(correlated) == 6  # banded, BLT with 1..4 buffers, the run's BLT
  for row in correlated:
    assert row.max_loss < dp_sgd.max_loss / 4  # about 6 against 65
    assert row.rms_loss < dp_sgd.rms_loss / 4
  assert rows['tree_full'].max_loss < rows['tree_efficient'].max_loss < rows['tree'].max_loss
  assert rows['blt (this run)'].run_mechanism
  assert sum(row.run_mechanism for row in table.rows) == 1
  # The run's BLT independently: sigma ||B_t|| from its dense decoder, sigma from its rho.
  strategy = blt.PRODUCTION_STRATEGIES[400]
  row_norms_sq = np.sum(strategy.decoder_matrix(n)**2, axis=1)
  sigma_run = math.sqrt(strategy.sensitivity_squared(n, schema) / (2 * rho))
  assert rows['blt (this run)'].max_loss == pytest.approx(
      sigma_run * math.sqrt(row_norms_sq.max()), rel=1e-9)
  # Every row meets the privacy: its own rho is the common one, so its epsilon is 8.
  for row in table.rows:
    assert zcdp.rho_from_sensitivity(row.sensitivity_squared, row.noise_multiplier) == (
        pytest.approx(rho, rel=1e-12))


def test_parameter_free_rows_match_brute_force_and_dense_decoder():
  n, schema, rho = 10, P(3, 3), 0.5
  run = registry.default_strategy('tree')
  table = equal_privacy.equal_privacy(n, schema, rho=rho, run_strategy=run)
  rows = _by_label(table)
  assert [name for name, row in rows.items() if row.run_mechanism] == ['tree']  # no extra row
  for name in ('gaussian', 'tree', 'tree_efficient', 'tree_full'):
    strategy, row = registry.default_strategy(name), rows[name]
    assert row.source == 'parameter-free'
    c = strategy.strategy_matrix(n)
    sens_sq = max(float(np.sum(c[:, list(p)].sum(axis=1)**2))
                  for p in patterns.patterns(schema, n))
    sigma = math.sqrt(sens_sq / (2 * rho))
    row_norms_sq = np.sum(strategy.decoder_matrix(n)**2, axis=1)
    assert row.sensitivity_squared == pytest.approx(sens_sq, rel=1e-12)
    assert row.noise_multiplier == pytest.approx(sigma, rel=1e-12)
    assert row.max_loss == pytest.approx(sigma * math.sqrt(row_norms_sq.max()), rel=1e-9)
    assert row.rms_loss == pytest.approx(sigma * math.sqrt(row_norms_sq.mean()), rel=1e-9)


def test_rows_and_bands_follow_the_run():
  n, schema = 24, P(4)
  run = tree.TreeStrategy('efficient', completion=True)  # not the parameter-free default
  table = equal_privacy.equal_privacy(n, schema, rho=1.0, run_strategy=run)
  labels = [row.mechanism for row in table.rows]
  assert labels == ['gaussian', 'tree', 'tree_efficient', 'tree_full', 'banded (4 bands)',
                    'blt (1 buffer)', 'blt (2 buffers)', 'blt (3 buffers)', 'blt (4 buffers)',
                    'tree_efficient (this run)']
  assert [row.run_mechanism for row in table.rows] == [False] * 9 + [True]
  # A banded run sets the bands compared; its own strategy is a row too.
  run = banded_optimizer.optimize_banded(n, 2, schema, toeplitz=True).strategy
  rows = _by_label(equal_privacy.equal_privacy(n, schema, rho=1.0, run_strategy=run))
  assert rows['banded (2 bands)'].source.startswith('banded Toeplitz C optimized on the spot')
  assert rows['banded (this run)'].run_mechanism
  no_run = equal_privacy.equal_privacy(n, schema, rho=1.0)
  assert not any(row.run_mechanism for row in no_run.rows)


def test_tree_full_is_skipped_past_its_cost_limit(monkeypatch):
  entry = registry.entry('tree_full')
  comparison = dataclasses.replace(entry.comparisons[0], max_rounds=8)
  monkeypatch.setitem(registry._REGISTRY._entries, 'tree_full',  # pylint: disable=protected-access
                      dataclasses.replace(entry, comparisons=(comparison,)))
  table = equal_privacy.equal_privacy(10, P(3), rho=1.0)
  assert 'tree_full' not in _by_label(table)
  assert len(table.skipped) == 1 and table.skipped[0].startswith('tree_full:')


def test_loss_against_epsilon_rescales_every_row_by_the_same_factor():
  table = equal_privacy.equal_privacy(16, P(4, 2), rho=0.3)
  epsilon = zcdp_epsilon.epsilon_from_rho(0.3, 1e-6, 'gaussian')
  curves = equal_privacy.loss_against_epsilon(table, 1e-6, [epsilon, 2 * epsilon])
  for row in table.rows:
    low, high = curves[row.mechanism]
    assert low == pytest.approx(row.max_loss, rel=1e-6)  # the calibration's tolerance
    assert high < low
  ratios = {curves[r.mechanism][1] / curves[r.mechanism][0] for r in table.rows}
  assert max(ratios) == pytest.approx(min(ratios), rel=1e-12)


@pytest.mark.parametrize('kwargs, match', [
    (dict(num_rounds=0, participation=P(1), rho=1.0), 'num_rounds'),
    (dict(num_rounds=5, participation='b=1', rho=1.0), 'participation'),
    (dict(num_rounds=5, participation=P(1), rho=0.0), 'rho'),
    (dict(num_rounds=5, participation=P(1), rho=1.0, run_strategy='blt'), 'run_strategy'),
])
def test_rejects_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    equal_privacy.equal_privacy(**kwargs)
