"""rho-zCDP and (epsilon, delta) of a correlated-noise mechanism without amplification.

Without sampling, a whole training run of a matrix mechanism is ONE Gaussian release of C x with noise
std sigma * zeta per coordinate (BandMF paper Sec. 2-3, docs/papers.md#bandmf; accounting colab,
cell `privacy_accounting`, docs/papers.md#colab). With clip norm zeta = 1 and squared sensitivity
sens^2 (the mechanisms' own `sensitivity_squared`, never re-derived here):

  * effective noise multiplier  sigma_eff = sigma / sens;
  * rho-zCDP                    rho = sens^2 / (2 sigma^2) = 1 / (2 sigma_eff^2);
  * (epsilon, delta)            from dp_accounting's PLD accountant (default settings: add-or-remove
                                neighbours, value discretization 1e-4) composed once with
                                `GaussianDpEvent(noise_multiplier = 1 / sqrt(2 rho))`, exactly as the
                                colab and the Gboard / BLT papers do (dp-accounting 0.4.3 has no zCDP
                                event, so the Gaussian event carries rho).

Two other conversions exist for comparison and for reproducing older papers:
  * 'gaussian': the exact Gaussian tradeoff curve (Balle & Wang 2018; it reproduces the rho ->
    epsilon pairs of the BLT paper's Sec. 5 and Table 4, docs/papers.md#blt),
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) with mu = sqrt(2 rho). Fast; the PLD
    value exceeds it by about 1e-7 relative (discretization). Used for plots.
  * 'rdp': RDP of the Gaussian, (alpha, alpha rho), converted with dp_accounting's RdpAccountant (the
    Canonne-Kamath-Steinke conversion) on TF-Privacy's order grid; the DP-FTRL paper's Tables 3-5
    (Sec. 7, App. E-G; docs/papers.md#dp-ftrl) use it.

Above `MAX_RHO` the PLD's distribution would not fit in memory, and a run is never refused for that:
its epsilon is the zCDP conversion bound (`zcdp_epsilon_bound`, conversion 'zcdp_bound'), an UPPER
bound on the true epsilon (never smaller), flagged as such wherever it is printed. It is the smaller
of two conversions valid for any rho-zCDP mechanism: dp_accounting's RDP conversion (Canonne, Kamath
& Steinke 2020, Prop. 12) of the Renyi curve (alpha, alpha rho) on the dense order grid
`ZCDP_BOUND_ORDERS`, and Bun & Steinke 2016's rho + 2 sqrt(rho ln(1/delta)) (tighter when the best
order lies below dp_accounting's smallest usable one, 1.01). Both are above the exact Gaussian
epsilon: by 4-13% at rho 1e-4 .. 1 and 2.6-3.9% at rho 100 (delta 1e-10 and 1e-5), by less as rho
grows beyond (1.2-1.7% at rho 1201, under 0.1% at 1e6).

Conventions: rounds are 0-based; `min_sep` = b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1);
noise multipliers are relative to the clip norm (noise std sigma * zeta on the SUM of clipped updates).
Tree restarts are composed across segments by the tree module (exact, min-sep spanning segments); for
other strategies restarts are composed by adding per-segment worst cases (a valid upper bound).
"""

import dataclasses
import math
from typing import Optional, Sequence

import dp_accounting
import numpy as np
import scipy.optimize
import scipy.special
from dp_accounting.pld import privacy_loss_mechanism

from dp_ftrl_tff import _validation, stopping
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.mechanisms import base, memory
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms.base import check_restart_rounds, segment_lengths  # noqa: F401

#: The conversion of an epsilon above what the PLD holds: an upper bound from rho-zCDP
#: (`zcdp_epsilon_bound`), never a tight figure.
ZCDP_BOUND = 'zcdp_bound'

CONVERSIONS = ('pld', 'gaussian', 'rdp', ZCDP_BOUND)

#: TF-Privacy's order grid (1.1 .. 10.9, 12 .. 63): with the 'rdp' conversion it reproduces the
#: DP-FTRL paper's Tables 3-5.
TF_PRIVACY_RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))

#: The orders of `zcdp_epsilon_bound`'s RDP conversion: alpha - 1 from 0.0101 (dp_accounting's
#: conversion gives inf at alpha <= 1.01) to 1e6, 500 of them evenly in log. The best order of
#: rho-zCDP at delta is about 1 + sqrt(ln(1/delta) / rho): inside the grid for rho from about 1e-11
#: to 2e5 at delta 1e-10; outside it the Bun-Steinke bound is the smaller one anyway at large rho.
ZCDP_BOUND_ORDERS = tuple(float(a) for a in 1.0 + np.geomspace(0.0101, 1e6, 500))

DEFAULT_DELTA = 1e-10

#: The largest rho-zCDP whose epsilon is computed by PLD. The PLD of one Gaussian event at
#: dp_accounting's default discretization 1e-4 has (eps_upper - eps_lower) / 1e-4 points, about
#: (2 rho + 16 sqrt(2 rho)) / 1e-4: 4.8e6 points at rho = 100 (0.67 GB at `PLD_BYTES_PER_POINT`,
#: tens of seconds), growing linearly with rho. Above it the epsilon is the zCDP conversion bound
#: (`zcdp_epsilon_bound`, flagged as an upper bound): epsilon is above 100 there at any delta below
#: 0.1, so the bound's few percent matter little, and no run is refused for the accountant's memory.
MAX_RHO = 100.0

#: Bytes the PLD accountant allocates per point of its distribution (tracemalloc peak of
#: `epsilon_from_rho` at rho = 1 .. 1000: 139 .. 152 bytes; a lower bound).
PLD_BYTES_PER_POINT = 140


def pld_points(rho: float) -> float:
  """Points of the PLD accountant's distribution for one Gaussian event of rho-zCDP `rho` > 0 (its
  connect-the-dots bounds at the default truncation, over the 1e-4 discretization); inf when the
  noise multiplier 1 / sqrt(2 rho) is not a positive float64."""
  noise = 1.0 / math.sqrt(2.0 * rho) if math.isfinite(rho) else 0.0
  if not noise > 0:
    return math.inf
  bounds = privacy_loss_mechanism.GaussianPrivacyLoss(noise, sensitivity=1.0).connect_dots_bounds()
  return (bounds.epsilon_upper - bounds.epsilon_lower) / 1e-4


def pld_holds(rho: float) -> bool:
  """True when the PLD accountant computes the epsilon of rho-zCDP `rho` (finite, <= `MAX_RHO`)."""
  return math.isfinite(rho) and rho <= MAX_RHO


def accounted_conversion(rho: float, conversion: str = 'pld') -> str:
  """The conversion an epsilon of rho-zCDP `rho` is computed with when `conversion` is asked for:
  `ZCDP_BOUND` for 'pld' above what the PLD holds (`pld_holds`), else `conversion`."""
  return ZCDP_BOUND if conversion == 'pld' and not pld_holds(rho) else conversion


def beyond_pld_text(rho: float) -> str:
  """Why an epsilon of rho-zCDP `rho` above `MAX_RHO` is the zCDP bound: the PLD's memory."""
  points = pld_points(rho)
  return (f'rho-zCDP {rho:.4g} is above the {MAX_RHO:g} whose privacy loss distribution the PLD '
          f'accountant holds (it would need {points:.3g} points, about '
          f'{memory.format_bytes(points * PLD_BYTES_PER_POINT)})')


def zcdp_epsilon_bound(rho: float, delta: float = DEFAULT_DELTA) -> float:
  """An upper bound on the epsilon at `delta` of any rho-zCDP mechanism (never below the true one).

  The smaller of dp_accounting's RDP conversion (Canonne, Kamath & Steinke 2020, Prop. 12) of the
  curve (alpha, alpha rho) on `ZCDP_BOUND_ORDERS` and Bun & Steinke 2016 (Prop. 1.3),
  rho + 2 sqrt(rho ln(1/delta)); both hold for every rho-zCDP mechanism, so their minimum does.

  Args:
    rho: rho-zCDP, finite, >= 0 (0 gives 0).
    delta: in (0, 1).

  Returns:
    epsilon as a float.
  """
  rho = _validation.check_nonnegative_float(rho, 'rho')
  delta = _check_delta(delta)
  return _zcdp_bound(rho, delta)


def bun_steinke_bound(rho: float, delta: float) -> float:
  """Bun & Steinke 2016, Prop. 1.3: rho-zCDP (rho >= 0) implies (rho + 2 sqrt(rho ln(1/delta)),
  delta)-DP for delta in (0, 1). Looser than the PLD, but finite at any delta > 0."""
  rho = _validation.check_nonnegative_float(rho, 'rho')
  delta = _check_delta(delta)
  return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _zcdp_bound(rho: float, delta: float) -> float:
  """`zcdp_epsilon_bound` of checked arguments; inf for an infinite rho (a guarantee's overflow)."""
  if rho == 0:
    return 0.0
  if not math.isfinite(rho):
    return math.inf
  bun_steinke = bun_steinke_bound(rho, delta)
  accountant = dp_accounting.rdp.RdpAccountant(orders=ZCDP_BOUND_ORDERS)
  accountant.compose(gaussian_event(rho), 1)
  rdp = float(accountant.get_epsilon(delta))
  return min(bun_steinke, rdp) if math.isfinite(rdp) else bun_steinke


def _check_delta(delta) -> float:
  return _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                          high_inclusive=False)


def rho_from_sensitivity(sensitivity_squared: float, noise_multiplier: float) -> float:
  """rho = sens^2 / (2 sigma^2) (clip norm 1, sigma relative to the clip norm); inf when it
  overflows float64."""
  sens_sq = _validation.check_nonnegative_float(sensitivity_squared, 'sensitivity_squared')
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  return _rho(sens_sq, sigma)


def _rho(sens_sq: float, sigma: float) -> float:
  """sens^2 / (2 sigma^2) in numpy float64: inf on overflow, 0 on underflow, never an exception
  (Python's sigma**2 raises OverflowError above 1.3e154 and ZeroDivisionError once it underflows)."""
  with np.errstate(over='ignore', under='ignore', divide='ignore'):
    return float(np.float64(sens_sq) / (2.0 * np.float64(sigma) * np.float64(sigma)))


def effective_noise_multiplier(sensitivity_squared: float, noise_multiplier: float) -> float:
  """sigma / sens: the noise multiplier of the equivalent single Gaussian mechanism (inf if sens=0)."""
  sens_sq = _validation.check_nonnegative_float(sensitivity_squared, 'sensitivity_squared')
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  return math.inf if sens_sq == 0 else sigma / math.sqrt(sens_sq)


def _gaussian_log_delta(epsilon: float, mu: float) -> float:
  """log delta(eps) of the Gaussian tradeoff with sensitivity/noise ratio mu, computed in logs."""
  log_a = scipy.special.log_ndtr(-epsilon / mu + mu / 2.0)
  log_b = epsilon + scipy.special.log_ndtr(-epsilon / mu - mu / 2.0)
  return float(log_a + np.log1p(-np.exp(min(log_b - log_a, 0.0))))


def _epsilon_gaussian(rho: float, delta: float) -> float:
  mu = math.sqrt(2.0 * rho)
  target = math.log(delta)
  if _gaussian_log_delta(0.0, mu) <= target:
    return 0.0
  upper = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))  # zCDP bound: always sufficient
  while _gaussian_log_delta(upper, mu) > target:
    upper *= 2.0
  return float(scipy.optimize.brentq(lambda e: _gaussian_log_delta(e, mu) - target, 0.0, upper,
                                     xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500))


def gaussian_event(rho: float) -> dp_accounting.GaussianDpEvent:
  """The dp_accounting event that carries rho > 0: one Gaussian with noise multiplier 1/sqrt(2 rho)."""
  return dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / math.sqrt(2.0 * rho))


def make_accountant(conversion: str = 'pld', *, value_discretization_interval: float = 1e-4,
                    orders: Optional[Sequence[float]] = None) -> dp_accounting.PrivacyAccountant:
  """A fresh dp_accounting accountant for `conversion` 'pld' or 'rdp' (see `epsilon_from_rho`).

  'gaussian' has none: dp_accounting has no accountant for the exact Gaussian tradeoff curve.
  """
  _validation.check_one_of(conversion, 'conversion', ('pld', 'rdp'))
  if conversion == 'pld':
    interval = _validation.check_positive_float(value_discretization_interval,
                                                'value_discretization_interval')
    return dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
  orders = TF_PRIVACY_RDP_ORDERS if orders is None else tuple(orders)
  if not orders or any(not isinstance(a, (int, float)) or a <= 1 for a in orders):
    raise ValueError(f'`orders` must be a non-empty sequence of numbers > 1, got {orders!r}.')
  return dp_accounting.rdp.RdpAccountant(orders=orders)


def epsilon_from_rho(rho: float, delta: float = DEFAULT_DELTA, conversion: str = 'pld', *,
                     value_discretization_interval: float = 1e-4,
                     orders: Optional[Sequence[float]] = None) -> float:
  """epsilon at `delta` of one Gaussian mechanism whose zCDP is rho (noise multiplier 1/sqrt(2 rho)).

  Args:
    rho: rho-zCDP, >= 0 (0 gives epsilon 0).
    delta: in (0, 1).
    conversion: 'pld' (default; dp_accounting PLD, the papers' convention), 'gaussian' (exact
      tradeoff curve), 'rdp' (dp_accounting RDP on `orders`) or 'zcdp_bound' (`zcdp_epsilon_bound`).
    value_discretization_interval: PLD only; dp_accounting's default 1e-4 reproduces the papers.
      PLD cost grows with rho (about 0.2 s at rho = 1, 2 s at rho = 10 on one core).
    orders: RDP only; defaults to `TF_PRIVACY_RDP_ORDERS`.

  Returns:
    epsilon as a float. With 'pld' and `rho` above `MAX_RHO` (its distribution would not fit in
    memory) it is `zcdp_epsilon_bound`, an upper bound: `accounted_conversion` says which it is.
  """
  rho = _validation.check_nonnegative_float(rho, 'rho')
  delta = _check_delta(delta)
  _validation.check_one_of(conversion, 'conversion', CONVERSIONS)
  return _epsilon(rho, delta, accounted_conversion(rho, conversion), value_discretization_interval,
                  orders)


def _epsilon(rho: float, delta: float, conversion: str, value_discretization_interval: float = 1e-4,
             orders: Optional[Sequence[float]] = None) -> float:
  """`epsilon_from_rho` of checked arguments. A PLD or RDP evaluation is a stop point
  (`dp_ftrl_tff.stopping`)."""
  if rho == 0:
    return 0.0
  if conversion == 'gaussian':
    return _epsilon_gaussian(rho, delta)
  if conversion == ZCDP_BOUND:
    return _zcdp_bound(rho, delta)
  stopping.check()
  accountant = make_accountant(conversion, orders=orders,
                               value_discretization_interval=value_discretization_interval)
  accountant.compose(gaussian_event(rho), 1)
  return float(accountant.get_epsilon(delta))


def accounted_sensitivity_squared(strategy: base.Strategy, num_rounds: int,
                                  participation: participation_lib.ParticipationSchema,
                                  restart_rounds: Optional[Sequence[int]] = None) -> float:
  """Squared sensitivity (clip norm 1) of a whole run, restarts included.

  Without restarts: `strategy.sensitivity_squared(n, participation)`. With restarts (the noise state
  restarts at each round in `restart_rounds`, so C is block diagonal):
  `strategy.segments_sensitivity_squared` (exact for trees and DP-SGD, an upper bound otherwise).
  """
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a mechanisms Strategy, got {strategy!r}.')
  # Each segment must fit the strategy (a banded strategy restarted past its n rounds runs longer).
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if not isinstance(participation, participation_lib.ParticipationSchema):
    raise ValueError(f'`participation` must be a ParticipationSchema, got {participation!r}.')
  return _sensitivity_squared(strategy, segment_lengths(num_rounds, restart_rounds), participation)


def _sensitivity_squared(strategy: base.Strategy, lengths: Sequence[int],
                         participation: participation_lib.ParticipationSchema) -> float:
  if len(lengths) == 1:
    return float(strategy.sensitivity_squared(lengths[0], participation))
  return float(strategy.segments_sensitivity_squared(lengths, participation))


@dataclasses.dataclass(frozen=True)
class Guarantee:
  """The DP guarantee of one training run (clip norm 1; noise multipliers relative to the clip).

  Attributes:
    mechanism: the strategy's name ('gaussian', 'tree', 'tree_efficient', 'banded', 'blt', ...).
    num_rounds: n.
    participation: the `ParticipationSchema` the sensitivity was computed for.
    restart_rounds: 0-based rounds at which the noise restarts (empty: none).
    sensitivity_squared: sens^2 of the whole run.
    noise_multiplier: sigma, the accounted noise multiplier (relative to the clip norm).
    rho: sens^2 / (2 sigma^2).
    epsilon: at `delta`, with `conversion`.
    delta: the target delta.
    conversion: 'pld', 'gaussian', 'rdp', or 'zcdp_bound' where the PLD (or a plan's guarantee in
      any conversion) was asked for above `MAX_RHO`: then `epsilon` is `zcdp_epsilon_bound`, an
      upper bound, not a tight figure (`epsilon_is_zcdp_bound`).
  """
  mechanism: str
  num_rounds: int
  participation: participation_lib.ParticipationSchema
  restart_rounds: tuple
  sensitivity_squared: float
  noise_multiplier: float
  rho: float
  epsilon: float
  delta: float
  conversion: str = 'pld'

  @property
  def epsilon_is_zcdp_bound(self) -> bool:
    """True when `epsilon` is the zCDP conversion bound (an upper bound: rho above `MAX_RHO`)."""
    return self.conversion == ZCDP_BOUND

  @property
  def effective_noise_multiplier(self) -> float:
    """sigma / sens, the noise multiplier of the equivalent single Gaussian mechanism."""
    return effective_noise_multiplier(self.sensitivity_squared, self.noise_multiplier)


def guarantee(strategy: base.Strategy, num_rounds: int,
              participation: participation_lib.ParticipationSchema, noise_multiplier: float,
              delta: float = DEFAULT_DELTA, *, restart_rounds: Optional[Sequence[int]] = None,
              conversion: str = 'pld') -> Guarantee:
  """rho-zCDP and (epsilon, delta) of `strategy` run for `num_rounds` rounds (no amplification).

  Args:
    strategy: a `dp_ftrl_tff.mechanisms` Strategy.
    num_rounds: n >= 1.
    participation: the participation schema (declared, or realized from a log).
    noise_multiplier: sigma > 0, relative to the clip norm. With adaptive clipping pass the accounted
      z (see `dp_ftrl_tff.settings.inflated_noise_multiplier`), not the inflated value multiplier.
    delta: in (0, 1), default 1e-10.
    restart_rounds: 0-based rounds at which the noise state restarts (None: no restart).
    conversion: see `epsilon_from_rho`.

  Returns:
    A `Guarantee`. With the 'pld' conversion and a rho above `MAX_RHO`, its epsilon is
    `zcdp_epsilon_bound` and its conversion 'zcdp_bound' (the closed forms convert any rho: the
    DP-FTRL paper's RDP epsilon 363.66 has rho 248).
  """
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a mechanisms Strategy, got {strategy!r}.')
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  delta = _check_delta(delta)
  _validation.check_one_of(conversion, 'conversion', CONVERSIONS)
  participation = participation_lib.check_participation(participation)
  restarts = check_restart_rounds(restart_rounds, num_rounds)
  return _guarantee(strategy, int(num_rounds), participation, sigma, delta,
                    base.segments_between(int(num_rounds), restarts), conversion)


def guarantee_for_plan(plan: plan_lib.RunPlan, num_rounds: Optional[int] = None,
                       participation: Optional[participation_lib.ParticipationSchema] = None,
                       conversion: str = 'pld') -> Guarantee:
  """The `Guarantee` of a run plan over `num_rounds` rounds (default: the plan's) under
  `participation` (default: the plan's declared one), at the plan's accounted noise multiplier,
  restarts and target delta (`DEFAULT_DELTA` when it has none); the plan was validated when it was
  built, so only what it lacks is checked here (`planned_guarantee`: the plan's own setting).

  Above `MAX_RHO` the guarantee's epsilon is `zcdp_epsilon_bound` (conversion 'zcdp_bound'),
  whatever the conversion asked for: a run's header and eval lines (a closed form) state the same
  figure as its report.

  Raises:
    ValueError: the plan adds no noise (it has no DP guarantee), or lacks the rounds or the
      participation and none is given.
  """
  num_rounds, participation = _plan_setting(plan, num_rounds, participation)
  return _plan_guarantee(plan, num_rounds, participation, plan.segments(num_rounds), conversion)


def planned_guarantee(plan: plan_lib.RunPlan, conversion: str = 'pld') -> Guarantee:
  """`guarantee_for_plan` of the plan's own rounds and declared participation, from the segments
  the plan carries (`RunPlan.planned_segments`)."""
  num_rounds, participation = _planned_setting(plan)
  return _plan_guarantee(plan, num_rounds, participation, plan.planned_segments, conversion)


def _plan_guarantee(plan: plan_lib.RunPlan, num_rounds: int,
                    participation: participation_lib.ParticipationSchema,
                    segments: base.Segments, conversion: str) -> Guarantee:
  if plan.noise_multiplier == 0:
    raise ValueError('`plan` has noise_multiplier 0: the run adds no noise and has no DP guarantee.')
  delta = DEFAULT_DELTA if plan.target_delta is None else plan.target_delta
  # Every conversion: a run's header (a closed form) must state the figure its report (the PLD, or
  # above `MAX_RHO` the zCDP bound) states.
  return _guarantee(plan.strategy, num_rounds, participation, plan.noise_multiplier, delta,
                    segments, conversion, any_conversion=True)


def plan_sensitivity_squared(plan: plan_lib.RunPlan, num_rounds: Optional[int] = None,
                             participation: Optional[participation_lib.ParticipationSchema] = None
                             ) -> float:
  """`accounted_sensitivity_squared` of the plan's strategy and restarts over `num_rounds`
  (default: the plan's rounds) under `participation` (default: the plan's declared one);
  `planned_sensitivity_squared` is this for the plan's own setting."""
  num_rounds, participation = _plan_setting(plan, num_rounds, participation)
  return _sensitivity_squared(plan.strategy, plan.segments(num_rounds).lengths, participation)


def planned_sensitivity_squared(plan: plan_lib.RunPlan) -> float:
  """`plan_sensitivity_squared` of the plan's own rounds and declared participation, from the
  segments the plan carries (`RunPlan.planned_segments`)."""
  _, participation = _planned_setting(plan)
  return _sensitivity_squared(plan.strategy, plan.planned_segments.lengths, participation)


def _plan_setting(plan, num_rounds, participation) -> tuple:
  """(n, participation) of a plan: the arguments given (checked here), else the plan's own."""
  if num_rounds is not None:
    num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if participation is not None:
    participation = participation_lib.check_participation(participation)
  return _planned_setting(plan, num_rounds, participation)


def _planned_setting(plan, num_rounds=None, participation=None) -> tuple:
  """(n, participation): those given (checked by the caller), else the plan's own (checked when
  the plan was made); ValueError when the plan lacks one that is not given."""
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {plan!r}.')
  setting = (plan.num_rounds if num_rounds is None else num_rounds,
             plan.participation if participation is None else participation)
  if setting[0] is None or setting[1] is None:
    raise ValueError('`plan` lacks the run\'s `rounds` or `participation`; give them.')
  return setting


def _guarantee(strategy: base.Strategy, num_rounds: int,
               participation: participation_lib.ParticipationSchema, sigma: float, delta: float,
               segments: base.Segments, conversion: str,
               any_conversion: bool = False) -> Guarantee:
  """`guarantee` of checked arguments (`segments`' restarts sorted, distinct, in (0, n)); with
  `any_conversion` a rho above `MAX_RHO` gets the zCDP bound whatever the conversion."""
  sens_sq = _sensitivity_squared(strategy, segments.lengths, participation)
  rho = _rho(sens_sq, sigma)
  conversion = accounted_conversion(rho, 'pld' if any_conversion and not pld_holds(rho)
                                    else conversion)
  return Guarantee(mechanism=strategy.name, num_rounds=num_rounds, participation=participation,
                   restart_rounds=segments.restart_rounds, sensitivity_squared=sens_sq,
                   noise_multiplier=sigma,
                   rho=rho, epsilon=_epsilon(rho, delta, conversion), delta=delta,
                   conversion=conversion)
