"""The DP guarantee of a run plan, as numbers and as a composable dp_accounting event.

`plan_guarantee(plan, rounds=, min_sep=, max_participations=, delta=)` reads a `dp_ftrl_tff.plan.RunPlan`
(the strategy, the noise it actually adds, the restart schedule, adaptive clipping, SecAgg) and returns
a `RunGuarantee`: rho-zCDP, (epsilon, delta) and a `dp_accounting.DpEvent` whose PLD epsilon at
`delta` is `epsilon`, so a user can compose the run with anything else they release.
`aggregators.CorrelatedNoiseFactory.privacy_guarantee` delegates here.

What is released, per noise segment, is C x + sigma z (docs/papers.md: BandMF paper Sec. 2-3; Gboard
paper Thm. 1 for adaptive clipping). With squared sensitivity sens^2 of the whole run (clip norm 1,
restart segments composed by `zcdp.accounted_sensitivity_squared`):
  * fixed clip: rho = sens^2 / (2 sigma^2);
  * adaptive clipping: each round also releases the centred clipped count (sensitivity 1/2 per
    participation) through the SAME correlated noise with std sigma_b. Both are Gaussian releases
    of C-encoded data, so their zCDP adds:
      rho_value = sens^2 / (2 z_Delta^2),  rho_count = sens^2 (1/2)^2 / (2 sigma_b^2),
      rho = rho_value + rho_count = sens^2 / (2 z^2),
    with z_Delta the value multiplier the model sum uses and z the accounted multiplier
    (`settings.inflated_noise_multiplier` is the inverse map). Here z is recomputed from the multipliers
    the aggregator really adds (`settings.accounted_noise_multiplier(z_Delta, sigma_b)`);
  * SecAgg: records are rounded before the secure sum, which can grow their L2 norm up to the
    post-rounding bound S >= clip (`aggregators.secure.sensitivity_clip`). The aggregator sets the
    noise std to sigma x S, so relative to the bound the records really have the guarantee is the
    one above, unchanged; it holds for every round whose secure sum did not wrap around the field
    (the privacy report lists wrapped rounds from the run's metrics).
The event is `zcdp_epsilon.gaussian_event(rho)` (one Gaussian with noise multiplier
1 / sqrt(2 rho)), and epsilon is `zcdp_epsilon.epsilon_from_rho(rho, delta)`: PLD with
dp_accounting's default discretization, so `PLDAccountant().compose(event).get_epsilon(delta)`
reproduces `epsilon` exactly.

No amplification by sampling is assumed. A plan with random `sampling` (Poisson or cyclic Poisson
cohorts) gets the same unamplified guarantee, which holds for every participation the sampler can
produce; a `min_sep` / `max_participations` the sampler does not enforce is refused
(`plan_checks.check_sampled_participation`).
Amplified accounting (`accounting.amplification`) belongs in `_dp_event`, the one place that turns
the plan's noise into an event (and the epsilon computed from it); the validation, the restart
schedule and the adaptive split stay as they are.

Conventions: rounds 0-based; `min_sep` = b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1);
`max_participations` = k, None for as many as `min_sep` allows (effective k = min(k, ceil(n / b)));
noise multipliers relative to the clip norm, on the SUM of clipped updates.
"""

import dataclasses
from typing import Optional

import dp_accounting

from dp_ftrl_tff import _validation, plan_checks, settings
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import zcdp, zcdp_epsilon
from dp_ftrl_tff.mechanisms import participation as participation_lib


@dataclasses.dataclass(frozen=True)
class RunGuarantee:
  """The guarantee of a run plan (clip norm 1; noise multipliers relative to the clip).

  Attributes:
    guarantee: the run as one `zcdp.Guarantee` at the accounted multiplier z (its `rho`,
      `epsilon`, `delta`, `sensitivity_squared`, `participation`, `restart_rounds`).
    dp_event: a dp_accounting event; its PLD epsilon at `delta` equals `epsilon`.
    rho_value: rho of the model sum, sens^2 / (2 z_Delta^2).
    rho_count: rho of the clipped-count query with adaptive clipping (0 with a fixed clip).
    value_noise_multiplier: z_Delta, the multiplier on the model sum.
    clipped_count_stddev: sigma_b with adaptive clipping, else None.
    sensitivity_exact: False when sens^2 is an upper bound (the guarantee is conservative).
    secure: the plan's `SecureAggregation`, or None; with it the noise is relative to the
      post-rounding L2 bound and the guarantee covers rounds without a modular wrap.
  """
  guarantee: zcdp.Guarantee
  dp_event: dp_accounting.DpEvent
  rho_value: float
  rho_count: float
  value_noise_multiplier: float
  clipped_count_stddev: Optional[float]
  sensitivity_exact: bool
  secure: Optional[settings.SecureAggregation]

  @property
  def rho(self) -> float:
    """rho-zCDP of the whole run (model sum and clipped count)."""
    return self.guarantee.rho

  @property
  def epsilon(self) -> float:
    """epsilon at `delta` (PLD)."""
    return self.guarantee.epsilon

  @property
  def delta(self) -> float:
    return self.guarantee.delta

  @property
  def noise_multiplier(self) -> float:
    """z, the accounted noise multiplier (sens / z is the run's Gaussian sensitivity ratio)."""
    return self.guarantee.noise_multiplier


def _dp_event(guarantee: zcdp.Guarantee) -> dp_accounting.DpEvent:
  """The event of the run's noise: one Gaussian release of the whole run (no amplification)."""
  return zcdp_epsilon.gaussian_event(guarantee.rho)


def plan_guarantee(plan: plan_lib.RunPlan, *, rounds: int, min_sep: int,
                   max_participations: Optional[int] = None, delta: float) -> RunGuarantee:
  """rho-zCDP, (epsilon, delta) and a composable DpEvent of `plan` run for `rounds` rounds.

  Args:
    plan: the `RunPlan` (its strategy, noise, restarts, adaptive clipping and SecAgg settings).
    rounds: n >= 1 (0-based rounds 0 .. n-1); the plan's restarts below n are applied.
    min_sep: b >= 1: two participations r1 < r2 of one client satisfy r2 - r1 >= b.
    max_participations: k >= 1, or None (default) for the schema's maximum ceil(n / b).
    delta: in (0, 1).

  Returns:
    A `RunGuarantee`.

  Raises:
    ValueError: naming the bad argument; also when the plan adds no noise (noise_multiplier 0: the
      run has no DP guarantee), when a segment exceeds the strategy's `max_rounds`, or when the
      plan's random sampling does not enforce `min_sep` / `max_participations`.
  """
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {plan!r}.')
  rounds = _validation.check_positive_int(rounds, 'rounds')
  participation = participation_lib.ParticipationSchema(
      min_sep=_validation.check_positive_int(min_sep, 'min_sep'),
      max_participations=(None if max_participations is None else
                          _validation.check_positive_int(max_participations,
                                                         'max_participations')))
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                           high_inclusive=False)
  if plan.sampling.random_cohorts:
    plan_checks.check_sampled_participation(plan.sampling, participation, rounds)
  if plan.noise_multiplier == 0:
    raise ValueError('`plan` has noise_multiplier 0: the run adds no noise and has no DP '
                     'guarantee.')
  value_nm = plan.value_noise_multiplier
  count_stddev = plan.clipped_count_stddev
  adaptive = plan.adaptive_clip is not None
  # The accounted z from the multipliers the aggregator really adds (see the module docstring).
  z = settings.accounted_noise_multiplier(value_nm, count_stddev) if adaptive else value_nm
  restarts = plan.restart_rounds(rounds)
  guarantee = zcdp.guarantee(plan.strategy, rounds, participation, z, delta,
                             restart_rounds=restarts)
  sens_sq = guarantee.sensitivity_squared
  exact = plan.strategy.segments_sensitivity_is_exact(plan.segment_lengths(rounds), participation)
  return RunGuarantee(
      guarantee=guarantee, dp_event=_dp_event(guarantee),
      rho_value=zcdp.rho_from_sensitivity(sens_sq, value_nm),
      rho_count=zcdp.rho_from_sensitivity(0.25 * sens_sq, count_stddev) if adaptive else 0.0,
      value_noise_multiplier=value_nm, clipped_count_stddev=count_stddev,
      sensitivity_exact=exact, secure=plan.secure)
