"""Mechanisms compared at equal privacy: each one's noise multiplier and losses at the run's rho.

Comparing mechanisms at the same noise multiplier is misleading (DP-SGD's sensitivity is the
smallest, so it looks most private while adding the most error). Here every mechanism gets the noise
multiplier that gives it the run's privacy, and its error is compared at that noise.

Equal privacy. Without amplification a run is one Gaussian release: its (epsilon, delta) is a
function of rho alone (`zcdp`), so equal (epsilon, delta) means equal rho, and mechanism i with
squared sensitivity sens_i^2 (clip norm 1, this participation, no restarts) needs
  sigma_i = sqrt(sens_i^2 / (2 rho))          (`calibration.noise_multiplier_for_rho`).
Losses at that noise. The BLT paper's loss figures (`mechanisms.base.Losses`, noise multiplier 1
relative to sens) are MaxLoss_i = sens_i sqrt(max_t ||B_t||^2) and RmsLoss_i = sens_i sqrt(mean_t
||B_t||^2), B = A C^-1. At sigma_i the noise on prefix sum t of the SUM of clipped updates has std
sigma_i ||B_t|| clip norms, so a row holds
  max_loss = sigma_i sqrt(max_t ||B_t||^2) = MaxLoss_i / sqrt(2 rho),
  rms_loss = sigma_i sqrt(mean_t ||B_t||^2) = RmsLoss_i / sqrt(2 rho),
in units of the clip norm on the sum (divide by clients_per_round for the mean). Ratios between rows
equal the ratios of the papers' MaxLoss / RmsLoss; only the common scale depends on rho, so curves
against epsilon (`loss_against_epsilon`) are parallel on log axes.

Mechanisms compared: the rows each registry entry lists (`registry.Mechanism.comparisons`):
'gaussian' (DP-SGD), 'tree', 'tree_efficient', 'tree_full' (while its O(n^3) losses take seconds:
n <= 2100), 'banded' at the run's number of bands (min(min_sep, n) unless the run is banded), as a
banded Toeplitz C optimized on the spot (the general BandMF optimizer takes minutes at n = 2000; the
row says so), and 'blt' with 1 to 4 buffers, optimized on the spot (`resolve.resolve_strategy`). The
run's own strategy is one more row unless it is one of these parameter-free ones. At n = 2000 all
rows take about 4 s on one core.

Conventions: rounds 0-based; `min_sep` = b (r2 - r1 >= b); noise multipliers relative to the clip
norm, on the sum. Rows are computed for one noise segment of n rounds (no restarts) and a fixed clip
(with adaptive clipping `noise_multiplier` is the accounted z; the value multiplier is inflated).
"""

import dataclasses
from typing import Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import _validation, stopping
from dp_ftrl_tff.accounting import calibration
from dp_ftrl_tff.mechanisms import base, memory, registry, resolve
from dp_ftrl_tff.mechanisms import participation as participation_lib

#: Epsilons of `loss_against_epsilon` by default: 0.5 to 16.
DEFAULT_EPSILONS = tuple(float(e) for e in np.geomspace(0.5, 16.0, 11))


@dataclasses.dataclass(frozen=True)
class EqualPrivacyRow:
  """One mechanism at the run's rho (see the module docstring for the units).

  Attributes:
    mechanism: label, e.g. 'gaussian', 'tree_efficient', 'banded (400 bands)', 'blt (2 buffers)',
      'blt (this run)'.
    noise_multiplier: sigma_i that gives the run's rho, relative to the clip norm.
    max_loss: sigma_i sqrt(max_t ||B_t||^2), clip norms on the sum.
    rms_loss: sigma_i sqrt(mean_t ||B_t||^2), clip norms on the sum.
    sensitivity_squared: sens_i^2 (clip norm 1) under the participation.
    sensitivity_exact: False when sens_i^2 is an upper bound (then the row is conservative).
    run_mechanism: True for the run's own strategy.
    source: how the strategy was obtained ('parameter-free', 'the run's strategy', or the
      optimizer and its objective; no wall time, so a report is a function of its inputs).
  """
  mechanism: str
  noise_multiplier: float
  max_loss: float
  rms_loss: float
  sensitivity_squared: float
  sensitivity_exact: bool
  run_mechanism: bool
  source: str


@dataclasses.dataclass(frozen=True)
class EqualPrivacy:
  """The comparison: rows, and the mechanisms left out with the reason.

  Attributes:
    num_rounds: n.
    participation: the `ParticipationSchema`.
    rho: the common rho-zCDP.
    rows: `EqualPrivacyRow`s, in the order of the module docstring.
    skipped: one 'mechanism: reason' string per mechanism not compared.
  """
  num_rounds: int
  participation: participation_lib.ParticipationSchema
  rho: float
  rows: Tuple[EqualPrivacyRow, ...]
  skipped: Tuple[str, ...] = ()


def _row(label: str, strategy: base.Strategy, num_rounds: int, participation, rho: float,
         run_mechanism: bool, source: str) -> EqualPrivacyRow:
  losses = strategy.losses(num_rounds, participation)
  sigma = calibration.noise_multiplier_for_rho(rho, losses.sensitivity_squared)
  scale = 1.0 / np.sqrt(2.0 * rho)  # = sigma / sens
  return EqualPrivacyRow(
      mechanism=label, noise_multiplier=sigma, max_loss=float(losses.max_loss * scale),
      rms_loss=float(losses.rms_loss * scale), sensitivity_squared=losses.sensitivity_squared,
      sensitivity_exact=bool(strategy.sensitivity_is_exact(num_rounds, participation)),
      run_mechanism=run_mechanism, source=source)


def _is_default(strategy: base.Strategy) -> bool:
  """True when `strategy` is its registry entry's parameter-free default."""
  entry = registry.entry(strategy.name)
  return (not entry.needs_parameters
          and strategy.to_config() == registry.default_strategy(strategy.name).to_config())


class _Attributes(dict):
  """Format fields of a row label from the strategy's attributes, e.g. '{num_bands}'."""

  def __init__(self, strategy: base.Strategy):
    super().__init__()
    self._strategy = strategy

  def __missing__(self, key):
    return getattr(self._strategy, key)


def _comparison_options(entry: registry.Mechanism, comparison: registry.Comparison,
                        num_rounds: int, run_strategy: Optional[base.Strategy]) -> dict:
  """The row's optimizer options: its own, and those of the run's strategy of this mechanism
  (e.g. its number of bands, at most n)."""
  options = dict(comparison.options)
  if run_strategy is not None and run_strategy.name == entry.name:
    for option in entry.optimizer_options:
      value = getattr(run_strategy, option.name, None)
      if option.name not in options and value is not None:
        options[option.name] = min(value, num_rounds) if option.kind == 'int' else value
  return options


def _candidate(entry, comparison, num_rounds, participation, run_strategy, run_is_default):
  """(label, registry name, thunk returning (strategy, source), is the run's) of one row."""
  if not entry.needs_parameters:
    is_run = run_is_default and run_strategy.name == entry.name
    return (comparison.label, entry.name,
            lambda: (registry.default_strategy(entry.name), 'parameter-free'), is_run)
  options = _comparison_options(entry, comparison, num_rounds, run_strategy)

  def make():
    resolved = resolve.resolve_strategy(entry.name, options=options, num_rounds=num_rounds,
                                        participation=participation)
    # No wall time here: the report is a function of the run's inputs (the same bytes on rebuild).
    source = f"optimized on the spot for {resolved.source.setting.get('error')} loss"
    return resolved.strategy, comparison.source.format(source=source)

  return comparison.label, entry.name, make, False


def equal_privacy(num_rounds: int, participation: participation_lib.ParticipationSchema, *,
                  rho: float, run_strategy: Optional[base.Strategy] = None) -> EqualPrivacy:
  """Every compared mechanism's noise multiplier, MaxLoss and RmsLoss at privacy `rho`.

  Args:
    num_rounds: n >= 1.
    participation: the run's `ParticipationSchema` (declared or realized).
    rho: the run's rho-zCDP, > 0 (equal rho is equal (epsilon, delta); for an epsilon target use
      `calibration.rho_for_epsilon`).
    run_strategy: the run's strategy, marked `run_mechanism` (its own row unless parameter-free);
      a banded one also sets the number of bands compared.

  Returns:
    An `EqualPrivacy`.
  """
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  participation = participation_lib.check_participation(participation)
  rho = _validation.check_positive_float(rho, 'rho')
  if run_strategy is not None and not isinstance(run_strategy, base.Strategy):
    raise ValueError(f'`run_strategy` must be a mechanisms Strategy, got {run_strategy!r}.')
  run_is_default = run_strategy is not None and _is_default(run_strategy)
  candidates = [(_candidate(entry, comparison, num_rounds, participation, run_strategy,
                            run_is_default), comparison)
                for entry in registry.entries() for comparison in entry.comparisons]
  if run_strategy is not None and not run_is_default:
    candidates.append(((f'{run_strategy.name} (this run)', run_strategy.name,
                        lambda: (run_strategy, "the run's strategy"), True), None))
  rows, skipped = [], []
  for (label, name, make, is_run), comparison in candidates:
    stopping.check()  # each row is a stop point (dp_ftrl_tff.stopping)
    reason = _skip_reason(name, None if is_run else comparison, num_rounds,
                          run_strategy if is_run else None)
    if reason:
      skipped.append(f'{label}: {reason}')
      continue
    try:
      strategy, source = make()
    except (memory.MemoryLimitError, memory.ComputeLimitError) as e:  # its optimizer's limits
      skipped.append(f'{label}: {e}')
      continue
    rows.append(_row(label.format_map(_Attributes(strategy)), strategy, num_rounds, participation,
                     rho, is_run, source))
  return EqualPrivacy(num_rounds=num_rounds, participation=participation, rho=rho,
                      rows=tuple(rows), skipped=tuple(skipped))


def _skip_reason(name: str, comparison: Optional[registry.Comparison], num_rounds: int,
                 run_strategy: Optional[base.Strategy]) -> Optional[str]:
  """Why a row is not compared (too many rounds for its cost, its strategy or the memory), or
  None."""
  if comparison is not None and comparison.max_rounds is not None and (
      num_rounds > comparison.max_rounds):
    return f'{comparison.cost} (n = {num_rounds} > {comparison.max_rounds})'
  if run_strategy is not None and run_strategy.max_rounds is not None and (
      num_rounds > run_strategy.max_rounds):
    return f'built for {run_strategy.max_rounds} rounds, fewer than n = {num_rounds}'
  try:
    memory.check_fits(name, num_rounds)
  except memory.MemoryLimitError as e:
    return str(e)
  return None


def loss_against_epsilon(table: EqualPrivacy, delta: float,
                         epsilons: Sequence[float] = DEFAULT_EPSILONS) -> dict:
  """{row label: MaxLoss at each epsilon}: the rows rescaled to the rho of each epsilon at `delta`.

  max_loss(eps) = max_loss * sqrt(rho / rho(eps)), rho(eps) from `calibration.rho_for_epsilon` with
  the exact Gaussian conversion (fast; within about 1e-7 relative of PLD; for plots).
  """
  if not isinstance(table, EqualPrivacy):
    raise ValueError(f'`table` must be an EqualPrivacy, got {table!r}.')
  epsilons = [_validation.check_positive_float(e, 'epsilons') for e in epsilons]
  if not epsilons:
    raise ValueError('`epsilons` must not be empty.')
  factors = np.sqrt([table.rho / calibration.rho_for_epsilon(e, delta, 'gaussian')
                     for e in epsilons])
  return {row.mechanism: [float(row.max_loss * f) for f in factors] for row in table.rows}
