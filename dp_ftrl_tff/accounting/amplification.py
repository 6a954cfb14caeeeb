"""Amplified accounting of banded matrix mechanisms under cyclic Poisson sampling.

BandMF paper (Choquette-Choo et al. 2023, Sec. 5 and App. F, docs/papers.md#bandmf), Thm. 4 with the
Poisson variant of App. F.3: split the population into `num_groups` = b-hat disjoint groups of
floor(m / b-hat) members (the m mod b-hat leftovers are dropped); round t (0-based) samples group
t mod b-hat, each member independently with probability `sampling_prob` (B / floor(m / b-hat) for an
expected batch size B). If the strategy C is lower triangular and b-hat-banded (C[i, j] = 0 for
i - j >= b-hat), the whole run is as private as DP-SGD run for ceil(n / b-hat) rounds with sampling
probability `sampling_prob` and noise multiplier sigma / kappa, kappa = max_j ||C[:, j]||_2 (each
member participates in at most one round of each block of b-hat rounds, and those rows of C x are
touched by that one column only). b-hat = 1 is DP-SGD itself.

As a dp_accounting event (`amplified_event`):

    SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma / kappa)), ceil(n / b-hat))

converted to (epsilon, delta) by dp_accounting's PLD accountant (pessimistic estimate: an upper bound
for any discretization interval; add-or-remove neighbours, which zero-out adjacency equals for
Poisson sampling) or its RDP accountant on TF-Privacy's orders. Calibration is
`dp_accounting.calibrate_dp_mechanism` on the same accountant and event.

Conventions: rounds are 0-based; the noise multiplier sigma is relative to the clip norm (noise std
sigma * zeta on the sum of clipped updates); the functions taking `noise_multiplier` alone assume
kappa = 1 (unit largest column norm, as `banded_optimizer.optimize_banded` returns). The guarantee is about
Poisson sampling: a run that shuffles (fixed-size batches) is not covered by this accounting.
"""

import contextlib
import math
from typing import Optional

import dp_accounting
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution

from dp_ftrl_tff import _validation, plan_checks, sampling, stopping
from dp_ftrl_tff.accounting import calibration, zcdp_epsilon
from dp_ftrl_tff.mechanisms import memory

ACCOUNTANTS = ('pld', 'rdp')

#: PLD value discretization of reported epsilons (dp_accounting's default, the papers' setting).
DEFAULT_VALUE_DISCRETIZATION = 1e-4

#: Default relative tolerance of `amplified_noise_multiplier` on sigma.
DEFAULT_RTOL = 1e-7

#: Widenings by 1.25 of `amplified_noise_multiplier`'s upper end past the exact Gaussian's sigma
#: (87 times in all): PLD and RDP overstate the exact epsilon by far less, so a target still not
#: met there is one the accountant cannot reach (RDP on TF-Privacy's orders stays above about
#: log(1 / delta) / 62 however large sigma is).
_MAX_WIDENING = 20


def num_compositions(num_rounds: int, num_groups: int) -> int:
  """ceil(n / b-hat): the DP-SGD rounds the amplified run is equivalent to."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  num_groups = _validation.check_positive_int(num_groups, 'num_groups')
  return -(-num_rounds // num_groups)


def group_sampling_prob(dataset_size: int, batch_size: int, num_groups: int) -> float:
  """B / floor(m / b-hat): the member sampling probability for an expected batch size B.

  Raises ValueError when a group has fewer than B members (b-hat > floor(m / B) leaves no
  amplification).
  """
  dataset_size = _validation.check_positive_int(dataset_size, 'dataset_size')
  batch_size = _validation.check_positive_int(batch_size, 'batch_size')
  num_groups = _validation.check_positive_int(num_groups, 'num_groups')
  group_size = dataset_size // num_groups
  if group_size < batch_size:
    raise ValueError(f'`num_groups`={num_groups} leaves groups of {group_size} members, fewer than '
                     f'`batch_size`={batch_size}: use at most floor(dataset_size / batch_size) = '
                     f'{dataset_size // batch_size} groups.')
  q = batch_size / group_size
  if q < sampling.MIN_SAMPLING_PROB:
    groups = '' if num_groups == 1 else f' and `num_groups`={num_groups}'
    raise ValueError(
        f'`dataset_size`={dataset_size} with `batch_size`={batch_size}{groups} gives the sampling '
        f'probability {q:.3g} (batch_size / floor(dataset_size / {num_groups})), below '
        f'{sampling.MIN_SAMPLING_PROB:.3g} (2^-52), the smallest whose amplified guarantee the '
        'accountant computes; use a smaller `dataset_size` or a larger `batch_size`.')
  return q


def _check_setting(rounds, bands, sampling_prob) -> tuple:
  rounds = _validation.check_positive_int(rounds, 'rounds')
  bands = _validation.check_positive_int(bands, 'bands')
  return rounds, bands, sampling.check_sampling_prob(sampling_prob)


class BelowAccountantRangeError(ValueError):
  """A noise multiplier below `min_noise_multiplier`: the amplified accountant's privacy loss
  distribution would be too large. A report then states the unamplified guarantee alone (it holds
  whatever the sampling; beyond `zcdp_epsilon.MAX_RHO` it is the zCDP bound)."""


def amplified_event(noise_multiplier: float, rounds: int, bands: int,
                    sampling_prob: float) -> dp_accounting.DpEvent:
  """The dp_accounting event of a b-hat-banded run with cyclic Poisson sampling (BandMF Thm. 4).

  Args:
    noise_multiplier: sigma / kappa > 0, relative to a largest column norm of 1.
    rounds: n >= 1.
    bands: b-hat >= 1, the number of sampling groups (the strategy must have at most b-hat bands).
    sampling_prob: q in (0, 1], the probability that a member of the round's group participates.

  Returns:
    ceil(n / b-hat) self-compositions of a Poisson-subsampled Gaussian (of the Gaussian itself when
    q = 1: nothing is sampled).
  """
  sigma = plan_checks.check_noise_multiplier(
      _validation.check_positive_float(noise_multiplier, 'noise_multiplier'))
  rounds, bands, q = _check_setting(rounds, bands, sampling_prob)
  event = dp_accounting.GaussianDpEvent(noise_multiplier=sigma)
  if q < 1.0:
    event = dp_accounting.PoissonSampledDpEvent(sampling_probability=q, event=event)
  return dp_accounting.SelfComposedDpEvent(event=event, count=num_compositions(rounds, bands))


def _accountant(accountant: str, value_discretization_interval: float):
  _validation.check_one_of(accountant, 'accountant', ACCOUNTANTS)
  return zcdp_epsilon.make_accountant(accountant,
                              value_discretization_interval=value_discretization_interval)


def amplified_epsilon(noise_multiplier: float, rounds: int, bands: int, sampling_prob: float,
                      delta: float, accountant: str = 'pld', *,
                      value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION
                      ) -> float:
  """epsilon at `delta` of `amplified_event` (see its arguments).

  Args:
    noise_multiplier: sigma relative to a largest column norm of 1, at least
      `min_noise_multiplier(rounds, bands, sampling_prob)` (`BelowAccountantRangeError`, a
      ValueError naming it, otherwise).
    rounds, bands, sampling_prob: n, b-hat and q as in `amplified_event`.
    delta: in (0, 1).
    accountant: 'pld' (dp_accounting's PLD, pessimistic) or 'rdp' (TF-Privacy's orders).
    value_discretization_interval: PLD only; coarser is faster and still an upper bound.
  """
  event = amplified_event(noise_multiplier, rounds, bands, sampling_prob)
  delta = zcdp_epsilon.check_delta(delta)
  floor = min_noise_multiplier(rounds, bands, sampling_prob)
  if noise_multiplier < floor:
    raise BelowAccountantRangeError(
        f'`noise_multiplier`={noise_multiplier:g} is below {floor:.4g}, the smallest the accountant '
        f'takes here (rho-zCDP {zcdp_epsilon.MAX_RHO:g} per event, `min_noise_multiplier`): its '
        'privacy loss distribution would be too large.')
  if accountant == 'pld':
    _check_composition_size(noise_multiplier, num_compositions(rounds, bands), sampling_prob,
                            value_discretization_interval)
  acc = _accountant(accountant, value_discretization_interval)
  with _rdp_rounding(accountant, sampling_prob):
    acc.compose(event)
    return float(acc.get_epsilon(delta))


#: Compositions from which `amplified_epsilon` first estimates the size of the composed privacy loss
#: distribution (below, a composition costs seconds at most).
_CHECKED_COMPOSITIONS = 1000


def composed_pld_points(noise_multiplier: float, compositions: int, sampling_prob: float,
                        value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION
                        ) -> Optional[int]:
  """Points of the distribution dp_accounting's PLD accountant builds for `compositions`
  self-compositions of the Poisson-subsampled Gaussian (q < 1): the length of its truncated
  self-convolution, from the same Chernoff bound (`dp_accounting.pld.common`, tail mass 1e-15) on
  the one-event distribution, summed over its remove and add halves. None when the installed
  dp_accounting does not expose them (the estimate reads its PMF's `_probs`)."""
  noise_multiplier = plan_checks.check_noise_multiplier(
      _validation.check_positive_float(noise_multiplier, 'noise_multiplier'))
  compositions = _validation.check_positive_int(compositions, 'compositions')
  sampling_prob = sampling.check_sampling_prob(sampling_prob)
  value_discretization_interval = _validation.check_positive_float(
      value_discretization_interval, 'value_discretization_interval')
  pld = privacy_loss_distribution.from_gaussian_mechanism(
      noise_multiplier, sampling_prob=sampling_prob,
      value_discretization_interval=value_discretization_interval)
  total = 0
  for pmf in {id(p): p for p in (pld._pmf_remove, pld._pmf_add)}.values():  # pylint: disable=protected-access
    probs = getattr(pmf.to_dense_pmf(), '_probs', None)
    if probs is None:
      return None
    lower, upper = pld_common.compute_self_convolve_bounds(probs, compositions, 1e-15)
    total += max(upper - lower + 1, len(probs))
  return total


def _check_composition_size(noise_multiplier: float, compositions: int, sampling_prob: float,
                            value_discretization_interval: float) -> None:
  """`memory.MemoryLimitError` (a ValueError naming `num_rounds`) when the composed distribution of
  `composed_pld_points` would not fit in the available memory at `zcdp_epsilon.PLD_BYTES_PER_POINT`
  bytes a point; nothing is checked up to `_CHECKED_COMPOSITIONS` compositions or without
  sampling."""
  if compositions <= _CHECKED_COMPOSITIONS or sampling_prob >= 1.0:
    return
  points = composed_pld_points(noise_multiplier, compositions, sampling_prob,
                               value_discretization_interval)
  if points is None:
    return
  needed, available = points * zcdp_epsilon.PLD_BYTES_PER_POINT, memory.available_bytes()
  if needed > available:
    raise memory.MemoryLimitError(
        f'`num_rounds`: ceil(num_rounds / num_groups) = {compositions} compositions of the '
        f'subsampled Gaussian (`sampling_prob`={sampling_prob:g}, `noise_multiplier`='
        f'{noise_multiplier:.4g}) make the PLD accountant\'s distribution {points:.3g} points long, '
        f'about {memory.format_bytes(needed)} at {zcdp_epsilon.PLD_BYTES_PER_POINT} bytes a point, '
        f'but only {memory.format_bytes(available)} of memory is available; use fewer '
        '`num_rounds`, more noise or a smaller `sampling_prob` (its epsilon would be far above any '
        'useful one).')


@contextlib.contextmanager
def _rdp_rounding(accountant: str, sampling_prob: float):
  """dp_accounting's RDP accountant refuses a Renyi divergence that rounds to a tiny negative
  value, which happens for small sampling probabilities (seen from q = 1e-6 at noise multiplier
  100, and below 1e-12 at 1): a ValueError naming `sampling_prob` and the PLD accountant."""
  try:
    yield
  except ValueError as error:
    if accountant != 'rdp' or 'Renyi divergence cannot be negative' not in str(error):
      raise
    raise ValueError(f'`sampling_prob`={sampling_prob:g} is too small for the rdp accountant: its '
                     'Renyi divergences round below zero in float64; use the pld accountant.'
                     ) from None


def amplified_noise_multiplier(target_epsilon: float, rounds: int, bands: int,
                               sampling_prob: float, delta: float, accountant: str = 'pld', *,
                               value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION,
                               rtol: float = DEFAULT_RTOL) -> float:
  """The smallest sigma (to `rtol` relative) with `amplified_epsilon` <= `target_epsilon`.

  The bracket's upper end is the unamplified sigma, sqrt(ceil(n / b-hat)) times the single-Gaussian
  sigma on the exact tradeoff curve (sampling only lowers epsilon), widened (at most
  `_MAX_WIDENING` times) until its epsilon meets the target; the lower end halves from there until
  epsilon exceeds it, but not below `min_noise_multiplier` (the unamplified run's rho-zCDP is
  `zcdp_epsilon.MAX_RHO` there: the accountant's range). Then
  `dp_accounting.calibrate_dp_mechanism`, which steps to the safe side of the root.

  Args:
    target_epsilon: in [`calibration.MIN_TARGET_EPSILON`, `calibration.max_epsilon(delta)`]
      (`calibration.check_pld_target_epsilon`), and above the epsilon at `min_noise_multiplier`
      (else a ValueError naming it: no sigma in the amplified accountant's range meets it; the
      unamplified calibration, `calibration.noise_multiplier_for_epsilon`, meets any target).
    rounds, bands, sampling_prob, delta, accountant, value_discretization_interval: as in
      `amplified_epsilon`.
    rtol: relative tolerance on sigma (brentq's xtol is rtol times the bracket's upper end).

  Returns:
    sigma relative to a largest column norm of 1, never below what `target_epsilon` needs.
  """
  rounds, bands, q = _check_setting(rounds, bands, sampling_prob)
  delta = zcdp_epsilon.check_delta(delta)
  epsilon = calibration.check_pld_target_epsilon(target_epsilon, delta)
  _validation.check_one_of(accountant, 'accountant', ACCOUNTANTS)
  rtol = _validation.check_float_in_range(rtol, 'rtol', 0.0, 0.1, low_inclusive=False)

  def gap(sigma):
    stopping.check()  # each accountant evaluation is a stop point (dp_ftrl_tff.stopping)
    return amplified_epsilon(sigma, rounds, bands, q, delta, accountant,
                             value_discretization_interval=value_discretization_interval) - epsilon

  high = math.sqrt(num_compositions(rounds, bands)) * calibration.noise_multiplier_for_epsilon(
      epsilon, 1.0, delta, conversion='gaussian')
  widenings = 0
  while gap(high) > 0:  # PLD / RDP are upper bounds on the exact curve: a small widening may remain
    widenings += 1
    if widenings > _MAX_WIDENING:
      raise ValueError(f'`target_epsilon`={epsilon:g} at delta {delta:g} is not reachable with the '
                       f'{accountant} accountant: its epsilon stays above the target at '
                       f'{1.25**_MAX_WIDENING:.0f} times the exact Gaussian\'s noise multiplier; give '
                       'a larger target' + (' or use the pld accountant.' if accountant == 'rdp'
                                            else '.'))
    high *= 1.25
  floor = min_noise_multiplier(rounds, bands, q)
  low = max(high / 2, floor)
  while (low_gap := gap(low)) <= 0:
    if low <= floor:
      raise ValueError(f'`target_epsilon`={epsilon:g} is not reachable: even at noise multiplier '
                       f'{floor:.4g} (the smallest the accountant takes, `min_noise_multiplier`), '
                       f'epsilon is only {low_gap + epsilon:.4g}; give a smaller target.')
    high, low = low, max(low / 2, floor)
  with _rdp_rounding(accountant, q):
    return calibration.calibrate(
        make_fresh_accountant=lambda: _accountant(accountant, value_discretization_interval),
        make_event_from_param=lambda sigma: amplified_event(sigma, rounds, bands, q),
        target_epsilon=epsilon, target_delta=delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(low, high),
        tol=rtol * high, accountant=accountant)


def min_noise_multiplier(rounds: int, bands: int, sampling_prob: float) -> float:
  """The smallest noise multiplier (relative to a largest column norm of 1) the accountant takes:
  one whose event has rho-zCDP `zcdp_epsilon.MAX_RHO`, the size limit of its privacy loss
  distribution (`zcdp_epsilon.pld_holds`). Without sampling (q = 1) the ceil(n / b-hat) Gaussian
  rounds are one Gaussian event, sqrt(ceil(n / b-hat) / (2 MAX_RHO)); with sampling each round is
  its own event, 1 / sqrt(2 MAX_RHO) (about 0.0707), and the composition's distribution spreads
  about as far as its epsilon."""
  count = num_compositions(rounds, bands) if sampling_prob == 1.0 else 1
  return math.sqrt(count / (2.0 * zcdp_epsilon.MAX_RHO))
