"""The report's certified bounds catch a mechanism with half its stated noise, and only such a one.

Setting (unit level, dense matrix math, no TensorFlow): the reference BLT over n = 14 rounds,
4-min-sep with k = 3 participations, delta 1e-3, sigma = sens (the accounted mu = sens / sigma = 1,
epsilon 3.14). Every seen canary takes part on the schema's worst-case pattern u (maximizing
||C u||, the accountant's sensitivity), and its projections are u + s * sigma * M g (M the plan's
noise matrix, g ~ N(0, I)); unseen ones hold only the noise. For BLT, C is square and invertible, so
the whitened per-round score has signal sqrt(u^T (M M^T)^-1 u) / (s sigma) = ||C u|| / (s sigma) =
1 / s: exactly the accountant's mu at s = 1 (a correct mechanism whose every canary is a worst case:
a bound above the accounted epsilon is then a failed bound), 2 at s = 1/2 (the broken mechanism:
twice the signal-to-noise the plan implies, true epsilon 7.58).

What the math gives: the report's bounds all hold together with probability >= confidence (each at
its Bonferroni share), so a correct mechanism warns in at most 1 - confidence of runs, which the
seeds check against the binomial; at half the noise the per-round (whitened) row's GDP fit
certifies well above the accounted epsilon with 1000 canaries of each kind (6.0 at seed 0: 0.79 of
the truth, where the plain all-iterates row certifies 2.1), so the warning fires, and stays below
the truth. (The one-run bound certifies nothing here: its delta term 2 m delta = 4 at m = 2000
canaries and delta 1e-3 swamps it; docs/auditing.md.)
"""

import itertools

import numpy as np
import pytest
import scipy.stats

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import report, report_render, zcdp
from dp_ftrl_tff.auditing import gdp
from dp_ftrl_tff.mechanisms import blt
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

NUM_ROUNDS, DELTA = 14, 1e-3
SCHEMA = participation_lib.ParticipationSchema.b_min_sep(4, 3)
STRATEGY = blt.REFERENCE_STRATEGY


def _plan():
  sens_sq = STRATEGY.sensitivity_squared(NUM_ROUNDS, SCHEMA)
  return plan_lib.RunPlan.for_accounting(STRATEGY, float(np.sqrt(sens_sq)), num_rounds=NUM_ROUNDS,
                                         participation=SCHEMA, target_delta=DELTA)


def _worst_pattern() -> np.ndarray:
  """The 4-min-sep, k = 3 pattern maximizing ||C u|| (brute force over the 0/1 patterns)."""
  c = STRATEGY.strategy_matrix(NUM_ROUNDS)
  best, best_value = None, -1.0
  for rounds in itertools.combinations(range(NUM_ROUNDS), 3):
    if min(np.diff(rounds)) < SCHEMA.min_sep:
      continue
    u = np.zeros(NUM_ROUNDS)
    u[list(rounds)] = 1.0
    value = float(np.sum((c @ u)**2))
    if value > best_value:
      best, best_value = u, value
  return best


PATTERN = _worst_pattern()


def _projections(plan, num_canaries, noise_scale, seed):
  """(2N, n) projections: N seen canaries on PATTERN plus noise_scale * sigma * M g, N unseen."""
  matrix = auditing.plan_noise_matrix(plan, NUM_ROUNDS)
  rng = np.random.default_rng(seed)
  noise = rng.standard_normal((2 * num_canaries, matrix.shape[1])) @ matrix.T
  projections = noise_scale * plan.noise_multiplier * noise
  projections[:num_canaries] += PATTERN
  return projections


def _record(projections, seed):
  num_canaries = projections.shape[0] // 2
  return auditing.CanaryRecord(client_ids=tuple(f'canary{i}' for i in range(num_canaries)),
                               seed=seed, dimension=1000, round_projections=projections,
                               final_cosines=None)


def _report(noise_scale, num_canaries, seed):
  plan = _plan()
  record = _record(_projections(plan, num_canaries, noise_scale, seed), seed)
  rounds = np.flatnonzero(PATTERN)
  ids = np.repeat(record.client_ids, rounds.size).tolist() + [f'once{r}' for r in range(NUM_ROUNDS)]
  log = log_lib.ParticipationLog.from_arrays(
      ids, np.concatenate([np.tile(rounds, num_canaries), np.arange(NUM_ROUNDS)]))
  result = report.build_report(plan, log, canaries=record)
  # The log realizes the declared schema: the headline is the accounted epsilon.
  assert result.guarantee.epsilon == pytest.approx(zcdp.guarantee_for_plan(plan).epsilon,
                                                   rel=1e-12)
  return result


def test_the_setting_is_the_accountant_s():
  plan = _plan()
  matrix = auditing.plan_noise_matrix(plan, NUM_ROUNDS)
  whitened_signal = np.sqrt(PATTERN @ np.linalg.solve(matrix @ matrix.T, PATTERN))
  assert whitened_signal / plan.noise_multiplier == pytest.approx(1.0, rel=1e-9)
  assert zcdp.guarantee_for_plan(plan).epsilon == pytest.approx(
      gdp.epsilon_for_delta(1.0, DELTA), rel=1e-3)


def test_half_the_noise_is_caught_by_the_per_round_row():
  result = _report(0.5, 1000, seed=0)
  accounted = result.guarantee.epsilon
  truth = gdp.epsilon_for_delta(2.0, DELTA)
  rows = {row.threat_model: row for row in result.empirical_privacy}
  assert list(rows) == ['all_iterates', 'all_iterates_whitened']
  best_row, best = auditing.best_bound(result.empirical_privacy)
  print(f'\nhalf noise: accounted {accounted:.3f}, true {truth:.3f}; best {best.epsilon:.3f} '
        f'({best.method}, {best_row.threat_model}); ' + '; '.join(
            f'{row.threat_model}: ' + ', '.join(f'{b.method} {b.epsilon:.3f}' for b in row.bounds)
            for row in rows.values()))
  # The per-round row certifies the most, above the accountant and below the truth.
  assert best_row.threat_model == 'all_iterates_whitened'
  assert accounted < best.epsilon < truth
  assert rows['all_iterates'].epsilon_lower_bound < best.epsilon
  (warning,) = result.warnings
  assert 'all_iterates_whitened' in warning and f'{best.epsilon:.4g}' in warning
  assert 'the accountant or the mechanism is wrong' in warning and 'Do not launch' in warning
  markdown = report_render.to_markdown(result)
  assert f'> - {warning}' in markdown and '**(above accounted)**' in markdown
  assert 'all_iterates_whitened) at 95% confidence' in markdown
  out = report_render.to_dict(result)['empirical_best_bound']
  assert out['threat_model'] == 'all_iterates_whitened' and out['fraction_of_accounted'] > 1


def test_half_the_noise_is_caught_over_seeds():
  # The detection is no luck: 10 more seeds, every one certifies more than the accounted epsilon.
  plan = _plan()
  accounted = zcdp.guarantee_for_plan(plan).epsilon
  participation = np.tile(PATTERN, (1000, 1))
  for seed in range(1, 11):
    rows = auditing.empirical_privacy(plan, _record(_projections(plan, 1000, 0.5, seed), seed),
                                      participation, DELTA)
    assert auditing.best_bound(rows)[1].epsilon > accounted, seed


def test_the_stated_noise_does_not_warn():
  result = _report(1.0, 1000, seed=0)
  assert result.warnings == ()
  assert '(above accounted)' not in report_render.to_markdown(result)


def test_the_stated_noise_warns_at_most_at_the_stated_rate():
  # A failed bound is the only way a correct mechanism whose canaries are all worst cases can show
  # a bound above the accounted epsilon: over 80 seeds, at most Binomial(80, 1 - confidence)'s
  # 1 - 1e-6 quantile of them may. A low confidence (0.5) makes the check sharp.
  confidence = 0.5
  plan = _plan()
  accounted = zcdp.guarantee_for_plan(plan).epsilon
  participation = np.tile(PATTERN, (300, 1))
  seeds, warned = 80, 0
  for seed in range(seeds):
    rows = auditing.empirical_privacy(plan, _record(_projections(plan, 300, 1.0, 100 + seed),
                                                    seed), participation, DELTA, confidence)
    warned += auditing.best_bound(rows)[1].epsilon > accounted
  assert warned <= scipy.stats.binom.ppf(1 - 1e-6, seeds, 1 - confidence)
