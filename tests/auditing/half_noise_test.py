"""A factory whose noise is half of what its plan accounts for: the empirical lower bound exceeds
the accounted epsilon and the privacy report warns (TensorFlow Federated, tests only).

The accounted plan (`RunPlan.build`, noise multiplier sigma, clip 1, m = 1 client per round, 4-min-sep
k = 3 over n = 14 rounds, delta 1e-2) is what the report is built from. The noise comes from the
project's REAL aggregator: `CorrelatedNoiseFactory` built from the same plan at sigma / 2 (the bug)
and run as a TFF process on a float32 vector of d = 2^15 parameters, one client sending zeros each
round, so its result (the noisy sum divided by m) is noise_t / m. 8000 seen canaries on the schema's
worst-case pattern and 8000 unseen ones (orthonormal Hadamard directions, `tests.auditing.streaming`,
so their projections are exact) are added to the released sums analytically; the seen canaries are
clients of a participation log, and `accounting.report.build_report(plan, log, canaries=record)`
audits them. A non-canary client on rounds 0, 4, 8 makes the log's realized schema (the report's
headline participation) exactly the declared one, so the headline epsilon is the accounted one the
bands below are for (asserted).

sigma makes the accounted signal-to-noise mu = sens / sigma = 1 (epsilon 2.32 at delta 1e-2); at
half the noise the scores have mu = 2 (epsilon 5.99), and the report's best certified bound (all
its bounds holding together at 95% confidence) must exceed the accounted epsilon, so the report
warns, and stay below the true epsilon, as a valid bound must. The control, the factory at the full
sigma (mu = 1), must not warn. How often either could go the other way is the math of
`tests/accounting/report_bounds_test.py` (the same score model, dense, over seeds); here the real
aggregator's noise goes through it once per case.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow_federated as tff

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log, report, zcdp, zcdp_epsilon
from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
from dp_ftrl_tff.auditing import records, statistics
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from tests.testing import canary_streams as streaming

pytestmark = pytest.mark.integration

NUM_CANARIES = 8000
NUM_ROUNDS = streaming.NUM_ROUNDS
SCHEMA = ParticipationSchema.b_min_sep(4, 3)
DELTA = 1e-2
MU = 1.0
CLIENTS_PER_ROUND = 1
FILLER_ROUNDS = (0, 4, 8)  # a non-canary client: realized min_sep 4, 3 participations


def factory_noise(plan: plan_lib.RunPlan, seed: int) -> np.ndarray:
  """(n, d) float64: the noise of the released SUMS of `CorrelatedNoiseFactory(plan)` (the TFF
  process on float32[DIMENSION], noise seed `seed`) over NUM_ROUNDS rounds: one client sends zeros,
  so round t's result, the noisy sum divided by `plan.clients_per_round` m, is noise_t / m."""
  process = CorrelatedNoiseFactory(plan, noise_seed=seed).create(
      tff.TensorType(np.float32, [streaming.DIMENSION]))
  state = process.initialize()
  zeros = [np.zeros(streaming.DIMENSION, np.float32)]
  rows = []
  for t in range(NUM_ROUNDS):
    output = process.next(state, zeros)
    state = output.state
    assert output.measurements['round'] == t
    assert output.measurements['noise_stddev'] == pytest.approx(
        plan.value_noise_multiplier * plan.clip_norm, rel=1e-6)
    rows.append(np.asarray(output.result, np.float64))
  return plan.clients_per_round * np.stack(rows)


def _audit(name: str, seed: int, noise_fraction: float):
  """(accounted plan, its epsilon, sens^2, report) with the factory's noise at `noise_fraction` of
  the accounted sigma."""
  strategy = streaming.make_strategy(name, SCHEMA)
  sens_sq = strategy.sensitivity_squared(NUM_ROUNDS, SCHEMA)
  sigma = np.sqrt(sens_sq) / MU
  plan = plan_lib.RunPlan.build(strategy, sigma, clients_per_round=CLIENTS_PER_ROUND,
                                clip_norm=1.0, num_rounds=NUM_ROUNDS, participation=SCHEMA,
                                target_delta=DELTA)
  accounted = zcdp.guarantee_for_plan(plan).epsilon
  m = statistics.plan_noise_matrix(plan, NUM_ROUNDS)
  u = streaming.worst_pattern(strategy, SCHEMA, m)
  covariance = np.eye(NUM_ROUNDS) if m is None else m @ m.T
  assert np.sqrt(u @ np.linalg.solve(covariance, u)) == pytest.approx(np.sqrt(sens_sq), rel=1e-9)

  noise = factory_noise(dataclasses.replace(plan, noise_multiplier=noise_fraction * sigma), seed)
  canaries = streaming.Canaries.draw(NUM_CANARIES, seed=seed)
  participation = np.tile(u, (NUM_CANARIES, 1))
  projections = streaming.projections(canaries, participation, noise) / plan.clip_norm
  client_ids = tuple(f'canary{i}' for i in range(NUM_CANARIES))
  record = records.CanaryRecord(client_ids=client_ids, seed=seed, dimension=streaming.DIMENSION,
                                round_projections=projections, final_cosines=None)
  rounds = np.flatnonzero(u)
  # One-time clients fill every round to the plan's cohort (a min-sep log has no short round).
  once = [f'once{r}' for r in range(NUM_ROUNDS)]
  log = participation_log.ParticipationLog.from_arrays(
      np.concatenate([np.repeat(client_ids, rounds.size), ['filler'] * len(FILLER_ROUNDS), once]),
      np.concatenate([np.tile(rounds, NUM_CANARIES), FILLER_ROUNDS,
                      np.arange(NUM_ROUNDS)]).astype(np.int64))
  privacy = report.build_report(plan, log, canaries=record)
  # The headline is the realized participation of the log: the declared schema, the accounted eps.
  assert privacy.participation_source == 'observed'
  assert privacy.guarantee.participation == SCHEMA
  assert privacy.guarantee.num_rounds == NUM_ROUNDS
  assert privacy.guarantee.epsilon == pytest.approx(accounted, rel=1e-12)
  return plan, accounted, sens_sq, privacy


def _row(privacy, threat_model):
  rows = {row.threat_model: row for row in privacy.empirical_privacy}
  assert rows[threat_model].canaries_seen == rows[threat_model].canaries_unseen == NUM_CANARIES
  return rows[threat_model]


def _lower_bound_warnings(privacy):
  return [f.text for f in privacy.findings_of('empirical') if f.severity == 'warning']


# Gaussian: C = I, the plain all-iterates score is the optimal test; BLT: the whitened one.
CASES = [(20, 'gaussian', 'all_iterates'), (21, 'blt', 'all_iterates_whitened')]


@pytest.mark.parametrize('seed,name,threat_model', CASES)
def test_half_the_noise_is_detected(seed, name, threat_model):
  plan, accounted, sens_sq, privacy = _audit(name, seed, noise_fraction=0.5)
  true_epsilon = zcdp_epsilon.epsilon_from_rho(
      zcdp.rho_from_sensitivity(sens_sq, plan.noise_multiplier / 2), DELTA)
  row = _row(privacy, threat_model)
  bound = row.epsilon_lower_bound
  print(f'\n{name} at half noise ({threat_model}): accounted epsilon {accounted:.3f} (mu {MU}), '
        f'true {true_epsilon:.3f} (mu {2 * MU}); certified lower bound {bound:.3f} '
        f'({row.lower_bound_method}); one-shot estimate {row.epsilon:.3f}')
  assert auditing.best_bound(privacy.empirical_privacy)[0].threat_model == threat_model
  assert bound > privacy.guarantee.epsilon  # the bug is caught
  assert bound < true_epsilon  # and the bound is still a valid one
  warnings = _lower_bound_warnings(privacy)
  assert any(f'({threat_model}: {bound:.4g} ' in w and 'Do not launch' in w for w in warnings), (
      privacy.warnings)


@pytest.mark.parametrize('seed,name,threat_model', CASES)
def test_the_full_noise_is_not_flagged(seed, name, threat_model):
  _, accounted, _, privacy = _audit(name, seed, noise_fraction=1.0)
  bound = _row(privacy, threat_model).epsilon_lower_bound
  print(f'\n{name} at the full noise ({threat_model}): accounted epsilon {accounted:.3f}; '
        f'certified lower bound {bound:.3f}')
  assert bound < accounted
  assert not _lower_bound_warnings(privacy), privacy.warnings
