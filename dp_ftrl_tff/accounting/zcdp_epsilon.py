"""(epsilon, delta) of a rho-zCDP Gaussian release: the conversions the accountants use.

A whole run of a matrix mechanism without sampling is one Gaussian release of rho-zCDP rho
(`dp_ftrl_tff.accounting.zcdp`). Its (epsilon, delta) comes from dp_accounting's PLD accountant
(default settings: add-or-remove neighbours, value discretization 1e-4) composed once with
`GaussianDpEvent(noise_multiplier = 1 / sqrt(2 rho))`, exactly as the accounting colab
(docs/papers.md#colab) and the Gboard / BLT papers do (dp-accounting 0.4.3 has no zCDP event, so
the Gaussian event carries rho).

Two other conversions exist for comparison and for reproducing older papers:
  * 'gaussian': the exact Gaussian tradeoff curve (Balle & Wang 2018; it reproduces the rho ->
    epsilon pairs of the BLT paper's Sec. 5 and Table 4, docs/papers.md#blt),
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) with mu = sqrt(2 rho). Fast; the
    PLD value exceeds it by about 1e-7 relative (discretization). Used for plots.
  * 'rdp': RDP of the Gaussian, (alpha, alpha rho), converted with dp_accounting's RdpAccountant
    (the Canonne-Kamath-Steinke conversion) on TF-Privacy's order grid; the DP-FTRL paper's
    Tables 3-5 (Sec. 7, App. E-G; docs/papers.md#dp-ftrl) use it.

Above `MAX_RHO` the PLD's distribution would not fit in memory, and a run is never refused for that:
its epsilon is the zCDP conversion bound (`zcdp_epsilon_bound`, conversion 'zcdp_bound'), an UPPER
bound on the true epsilon (never smaller), flagged as such wherever it is printed. It is the smaller
of two conversions valid for any rho-zCDP mechanism: dp_accounting's RDP conversion (Canonne, Kamath
& Steinke 2020, Prop. 12) of the Renyi curve (alpha, alpha rho) on the dense order grid
`ZCDP_BOUND_ORDERS`, and Bun & Steinke 2016's rho + 2 sqrt(rho ln(1/delta)) (tighter when the best
order lies below dp_accounting's smallest usable one, 1.01). Both are above the exact Gaussian
epsilon: by 4-13% at rho 1e-4 .. 1 and 2.6-3.9% at rho 100 (delta 1e-10 and 1e-5), by less as rho
grows beyond (1.2-1.7% at rho 1201, under 0.1% at 1e6).
"""

import math
from typing import Optional, Sequence

import dp_accounting
import numpy as np
import scipy.optimize
import scipy.special
from dp_accounting.pld import privacy_loss_mechanism

from dp_ftrl_tff import _validation, stopping
from dp_ftrl_tff.mechanisms import memory

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
  delta = check_delta(delta)
  return _zcdp_bound(rho, delta)


def bun_steinke_bound(rho: float, delta: float) -> float:
  """Bun & Steinke 2016, Prop. 1.3: rho-zCDP (rho >= 0) implies (rho + 2 sqrt(rho ln(1/delta)),
  delta)-DP for delta in (0, 1). Looser than the PLD, but finite at any delta > 0."""
  rho = _validation.check_nonnegative_float(rho, 'rho')
  delta = check_delta(delta)
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


def check_delta(delta) -> float:
  """`delta` as a float; ValueError naming `delta` unless it is in (0, 1)."""
  return _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                          high_inclusive=False)


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
  """The dp_accounting event that carries rho > 0: one Gaussian with noise multiplier
  1/sqrt(2 rho)."""
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
  """epsilon at `delta` of one Gaussian mechanism whose zCDP is rho
  (noise multiplier 1/sqrt(2 rho)).

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
  delta = check_delta(delta)
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
