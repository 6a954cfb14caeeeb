"""Choosing the number of bands of an amplified BandMF run (BandMF paper Sec. 5, App. F.4).

With cyclic Poisson sampling (`amplification`), b-hat bands and as many sampling groups give a
member sampling probability q(b-hat) = B / floor(m / b-hat) and ceil(n / b-hat) compositions; the
noise multiplier sigma(b-hat) that meets (epsilon, delta) grows with b-hat, while the error of the
best b-hat-banded strategy falls. The paper picks b-hat in 1 .. floor(m / B) minimizing

    sigma(b-hat)^2 * L(b-hat),   L = kappa^2 * ||A C^-1||_F^2 / n,

with C the optimum of Problem 2 for b-hat bands (unit column norms, so kappa = 1) and A the
prefix-sum workload. Under amplification each equivalent DP-SGD round releases the rows touched by
ONE column of C, so the strategy is normalized for single participation (largest column norm 1), not
for (k, b) participation: the loss here is the RmsLoss under single participation (BandMF App. F.5;
the optimum of Problem 2 does not depend on that choice, since with unit column norms and
b-hat <= min_sep every participation schema scales the loss by the same k). The table reports
sigma * RmsLoss, the expected prefix-sum RMSE per coordinate at clip norm 1: its square is the
objective.

Search (`BandSelector.select`): the losses need one BandMF optimization per b-hat (seconds to a
minute at n = 2052), so not every b-hat is optimized: a coarse grid 1, 2, 4, ..., floor(m / B), then
branch and bound between grid points. The objective is NOT unimodal: ceil(n / b-hat) jumps, so
sigma(b-hat) is a sawtooth (at n = 64, b-hat = 22 composes 3 times and b-hat = 21 four times). The
bound uses what is monotone: the loss falls with b-hat, sigma rises with q and with the number of
compositions. Losses are cached per b-hat, so one selector serves several (epsilon, delta) targets.
`exhaustive` evaluates every b-hat (for tests and small n).

Candidate sets (`candidates=`): the full search above (None or 'all'), the powers of two 1, 2, 4, ...
up to floor(m / B) ('pow2'), or any given b-hat values; a restricted set is evaluated in full. The
BandMF paper's choices come from powers of two: with 'pow2' this objective reproduces 108 of the
110 cells of its App. G.1 table (n = 1024; the other two are near ties) and its Table 5 b-hat at
epsilon 4 and 8 (32, 64), while the full search finds b-hat = 12, 21, 42, 76 at epsilon 1, 2, 4, 8
where Table 5 has 9, 18, 32, 64, within 1.2% of the full search's RMSE on a flat objective
(docs/amplification.md).

Conventions: rounds are 0-based; noise multipliers are relative to the clip norm and to a largest
column norm of 1; the loss follows the BLT paper's RmsLoss = sens * sqrt(mean_i ||B_i||^2).
"""

import dataclasses
import numbers
from typing import Dict, Optional, Tuple

from dp_ftrl_tff import _validation
from dp_ftrl_tff.accounting import amplification, calibration
from dp_ftrl_tff.mechanisms import banded, banded_optimizer, memory, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib

#: PLD discretization of the calibration inside the search: SEARCH_VALUE_DISCRETIZATION times
#: min(1, epsilon). At epsilon >= 1 that is 10x coarser than reports, about 10x faster, and sigma
#: about 0.1% larger than with 1e-4 at the paper's setting; dp_accounting's pessimistic PLD stays
#: an upper bound, so sigma errs on the safe side. A fixed 1e-3 is not enough below epsilon 1: the
#: pessimistic rounding accumulates over the compositions, so at epsilon 1/32 it overstated sigma of
#: 1024 compositions (b-hat = 1, n = 1024, q = 1/2) 2.8 times (4727 against 1715 at 1e-5) and of
#: 512 compositions at q = 1 by 0.1%, and the search preferred fewer, larger groups for that reason
#: alone (the App. G.1 cells at epsilon <= 1/4).
SEARCH_VALUE_DISCRETIZATION = 1e-3

#: Relative tolerance of the calibrated sigmas inside the search.
SEARCH_RTOL = 1e-4

_ERRORS = ('rms', 'max')

#: Named candidate sets of `BandSelector.select`: the full search, the powers of two.
CANDIDATE_SETS = ('all', 'pow2')


@dataclasses.dataclass(frozen=True)
class BandCandidate:
  """One row of the band-selection table.

  Attributes:
    num_bands: b-hat (also the number of sampling groups).
    sampling_prob: q = B / floor(m / b-hat).
    compositions: ceil(n / b-hat).
    noise_multiplier: sigma(b-hat) for the target, relative to a largest column norm of 1.
    loss: the optimized strategy's RmsLoss (or MaxLoss with error='max') under single participation
      (clip norm 1, noise multiplier 1).
    rmse: noise_multiplier * loss, the objective (its square is sigma^2 * L).
  """
  num_bands: int
  sampling_prob: float
  compositions: int
  noise_multiplier: float
  loss: float
  rmse: float

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BandSelection:
  """The result of a band selection: every evaluated candidate and the best one.

  Attributes:
    target_epsilon, delta: the privacy target.
    num_rounds, dataset_size, batch_size: n, m and B.
    accountant: 'pld' or 'rdp'.
    error: 'rms' or 'max'.
    candidates: the evaluated `BandCandidate`s, by increasing num_bands.
    best: the candidate with the smallest rmse.
    strategy: the optimized `BandedStrategy` of `best` (unit column norms).
    candidate_set: the b-hat values searched, in words: 'all 1 .. M (branch and bound)',
      'all 1 .. M (exhaustive)', 'pow2 1, 2, ..., P' or 'given b1, b2, ...'.
  """
  target_epsilon: float
  delta: float
  num_rounds: int
  dataset_size: int
  batch_size: int
  accountant: str
  error: str
  candidates: Tuple[BandCandidate, ...]
  best: BandCandidate
  strategy: banded.BandedStrategy
  candidate_set: str


def max_bands(num_rounds: int, dataset_size: int, batch_size: int) -> int:
  """min(floor(m / B), n): the largest b-hat with amplification (groups of at least B members)."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  dataset_size = _validation.check_positive_int(dataset_size, 'dataset_size')
  batch_size = _validation.check_positive_int(batch_size, 'batch_size')
  if batch_size > dataset_size:
    raise ValueError(f'`batch_size`={batch_size} exceeds `dataset_size`={dataset_size}.')
  return min(dataset_size // batch_size, num_rounds)


def coarse_grid(largest: int) -> Tuple[int, ...]:
  """1, 2, 4, ... below `largest`, then `largest`."""
  largest = _validation.check_positive_int(largest, 'largest')
  grid, b = [], 1
  while b < largest:
    grid.append(b)
    b *= 2
  return tuple(grid + [largest])


def powers_of_two(largest: int) -> Tuple[int, ...]:
  """1, 2, 4, ... up to `largest` (the BandMF paper's b-hat grid)."""
  largest = _validation.check_positive_int(largest, 'largest')
  return tuple(2**i for i in range(largest.bit_length()))


def candidate_bands(candidates, largest: int) -> Optional[Tuple[int, ...]]:
  """The b-hat values of `candidates`, sorted and unique; None for the full search.

  Args:
    candidates: None or 'all' (the full search), 'pow2' (`powers_of_two(largest)`), or a non-empty
      iterable of integers in 1 .. `largest`.
    largest: the largest admissible b-hat (`max_bands`).

  Raises:
    ValueError: naming `candidates` for an unknown name, an empty set, a non-integer or a value
      outside 1 .. `largest`.
  """
  largest = _validation.check_positive_int(largest, 'largest')
  if candidates is None or (isinstance(candidates, str) and candidates == 'all'):
    return None
  if isinstance(candidates, str):
    if candidates != 'pow2':
      raise ValueError(f'`candidates` must be one of {CANDIDATE_SETS} or b-hat values, got '
                       f'{candidates!r}.')
    return powers_of_two(largest)
  try:
    values = list(candidates)
  except TypeError:
    raise ValueError(f'`candidates` must be one of {CANDIDATE_SETS} or an iterable of b-hat '
                     f'values, got {candidates!r}.') from None
  if not values:
    raise ValueError('`candidates` must not be empty.')
  for value in values:
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
        or not 1 <= value <= largest):
      raise ValueError(f'`candidates` must hold integers in 1 .. {largest} (min(floor(dataset_size '
                       f'/ batch_size), num_rounds)), got {value!r}.')
  return tuple(sorted({int(value) for value in values}))


def describe_candidates(bands: Optional[Tuple[int, ...]], largest: int, search: str) -> str:
  """`BandSelection.candidate_set` for the candidate b-hat `bands` (None: all of 1 .. largest)."""
  if bands is None:
    return f'all 1 .. {largest} ({search})'
  if bands == powers_of_two(largest):
    return 'pow2 ' + ', '.join(str(b) for b in bands)
  return 'given ' + ', '.join(str(b) for b in bands)


class BandSelector:
  """Band selection for one setting (n, m, B); losses and strategies are cached per b-hat."""

  def __init__(self, num_rounds: int, dataset_size: int, batch_size: int, *, error: str = 'rms',
               accountant: str = 'pld',
               value_discretization_interval: Optional[float] = None,
               rtol: float = SEARCH_RTOL, max_iterations: int = 100,
               max_seconds: Optional[float] = None):
    """Args:
      num_rounds: n.
      dataset_size: m, the population (examples or clients) split into the sampling groups.
      batch_size: B, the expected number of participants per round.
      error: 'rms' (the paper's) or 'max': the loss optimized and reported.
      accountant: 'pld' or 'rdp'.
      value_discretization_interval: PLD discretization of the calibration; None (default):
        SEARCH_VALUE_DISCRETIZATION * min(1, target_epsilon), per target.
      rtol: relative tolerance of each calibrated sigma.
      max_iterations, max_seconds: passed to the BandMF optimizer for each b-hat.
    """
    self.max_bands = max_bands(num_rounds, dataset_size, batch_size)
    # The smallest sampling probability of the search, B / m at one group: an accountable one.
    amplification.group_sampling_prob(dataset_size, batch_size, 1)
    self.num_rounds = int(num_rounds)
    self.dataset_size = int(dataset_size)
    self.batch_size = int(batch_size)
    self.error = _validation.check_one_of(error, 'error', _ERRORS)
    self.accountant = _validation.check_one_of(accountant, 'accountant', amplification.ACCOUNTANTS)
    self.value_discretization_interval = None if value_discretization_interval is None else (
        _validation.check_positive_float(value_discretization_interval,
                                         'value_discretization_interval'))
    self.rtol = _validation.check_float_in_range(rtol, 'rtol', 0.0, 1e-3, low_inclusive=False)
    self._optimizer_options = {
        'max_iterations': _validation.check_positive_int(max_iterations, 'max_iterations'),
        'max_seconds': None if max_seconds is None else _validation.check_positive_float(
            max_seconds, 'max_seconds')}
    self._strategies: Dict[int, banded.BandedStrategy] = {}
    self._losses: Dict[int, float] = {}
    self._sigmas: Dict[tuple, float] = {}

  def _check_bands(self, num_bands) -> int:
    num_bands = _validation.check_positive_int(num_bands, 'num_bands')
    if num_bands > self.max_bands:
      raise ValueError(f'`num_bands`={num_bands} exceeds min(floor(dataset_size / batch_size), '
                       f'num_rounds) = {self.max_bands}.')
    return num_bands

  def strategy(self, num_bands: int) -> banded.BandedStrategy:
    """The optimized b-hat-banded strategy (unit column norms), via the registry's optimizer."""
    num_bands = self._check_bands(num_bands)
    if num_bands not in self._strategies:
      result = registry.optimizer('banded')(
          num_rounds=self.num_rounds, num_bands=num_bands,
          participation=participation_lib.ParticipationSchema.single(), error=self.error,
          **self._optimizer_options)
      self._strategies[num_bands] = result.strategy
      losses = result.losses
      self._losses[num_bands] = losses.rms_loss if self.error == 'rms' else losses.max_loss
    return self._strategies[num_bands]

  def loss(self, num_bands: int) -> float:
    """RmsLoss (or MaxLoss) of `strategy(num_bands)` under single participation (sens = kappa)."""
    self.strategy(num_bands)
    return self._losses[num_bands]

  def noise_multiplier(self, num_bands: int, target_epsilon: float, delta: float) -> float:
    """sigma(b-hat) meeting (target_epsilon, delta) with b-hat groups (`amplification`)."""
    num_bands = self._check_bands(num_bands)
    key = (num_bands, float(target_epsilon), float(delta))
    if key not in self._sigmas:
      self._sigmas[key] = amplification.amplified_noise_multiplier(
          target_epsilon, self.num_rounds, num_bands, self.sampling_prob(num_bands), delta,
          self.accountant, value_discretization_interval=self._discretization(target_epsilon),
          rtol=self.rtol)
    return self._sigmas[key]

  def _discretization(self, target_epsilon: float) -> float:
    """The PLD discretization of the calibrations for `target_epsilon`."""
    if self.value_discretization_interval is not None:
      return self.value_discretization_interval
    return SEARCH_VALUE_DISCRETIZATION * min(1.0, float(target_epsilon))

  def sampling_prob(self, num_bands: int) -> float:
    """q = B / floor(m / b-hat)."""
    return amplification.group_sampling_prob(self.dataset_size, self.batch_size,
                                             self._check_bands(num_bands))

  def candidate(self, num_bands: int, target_epsilon: float, delta: float) -> BandCandidate:
    """The table row of b-hat = `num_bands` for the target."""
    sigma = self.noise_multiplier(num_bands, target_epsilon, delta)
    loss = self.loss(num_bands)
    return BandCandidate(num_bands=num_bands, sampling_prob=self.sampling_prob(num_bands),
                         compositions=amplification.num_compositions(self.num_rounds, num_bands),
                         noise_multiplier=sigma, loss=loss, rmse=sigma * loss)

  def _selection(self, target_epsilon, delta, evaluated: Dict[int, BandCandidate],
                 candidate_set: str) -> BandSelection:
    best = min(evaluated.values(), key=lambda c: (c.rmse, c.num_bands))
    return BandSelection(
        target_epsilon=float(target_epsilon), delta=float(delta), num_rounds=self.num_rounds,
        dataset_size=self.dataset_size, batch_size=self.batch_size, accountant=self.accountant,
        error=self.error, candidates=tuple(evaluated[b] for b in sorted(evaluated)), best=best,
        strategy=self.strategy(best.num_bands), candidate_set=candidate_set)

  def _sigma_lower_bound(self, sampling_prob: float, compositions: int, target_epsilon: float,
                         delta: float) -> float:
    """A lower bound on sigma(b-hat) for every b-hat with q >= `sampling_prob` and at least
    `compositions` compositions (epsilon grows with both), less the calibration's tolerance."""
    key = ('bound', float(sampling_prob), int(compositions), float(target_epsilon), float(delta))
    if key not in self._sigmas:
      self._sigmas[key] = amplification.amplified_noise_multiplier(
          target_epsilon, compositions, 1, sampling_prob, delta, self.accountant,
          value_discretization_interval=self._discretization(target_epsilon), rtol=self.rtol)
    # The calibrated sigma lies within a few rtol of the exact root (its bracket is at most 2x wide).
    return self._sigmas[key] * (1.0 - 8.0 * self.rtol)

  def select(self, target_epsilon: float, delta: float, selection_rtol: float = 0.0,
             candidates=None) -> BandSelection:
    """The best b-hat among `candidates` (`candidate_bands`): a given set is evaluated in full;
    the full search (None or 'all') is a coarse grid, then branch and bound between grid points.

    For b-hat strictly between evaluated a < c: q(b-hat) >= q(a + 1), ceil(n / b-hat) >=
    ceil(n / (c - 1)) and L(b-hat) >= L(c) (more bands never raise the optimal loss), so
    sigma(q(a + 1), ceil(n / (c - 1))) * L(c) bounds their objective from below. An interval whose
    bound is not below the best rmse / (1 + `selection_rtol`) is dropped; otherwise its midpoint is
    evaluated and both halves are examined. With `selection_rtol` = 0 the result is the exhaustive
    optimum whenever the optimizer's losses do not increase with b-hat. A `target_epsilon` outside
    [`calibration.MIN_TARGET_EPSILON`, `calibration.max_epsilon(delta)`] is a ValueError naming it
    (`calibration.check_pld_target_epsilon`: the amplified accountant is a PLD).
    """
    _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                     high_inclusive=False)
    # A target the calibration cannot meet is refused before any strategy is optimized.
    calibration.check_pld_target_epsilon(target_epsilon, delta)
    selection_rtol = _validation.check_nonnegative_float(selection_rtol, 'selection_rtol')
    bands = candidate_bands(candidates, self.max_bands)
    self._check_search_cost(bands)
    if bands is not None:
      return self._selection(target_epsilon, delta, {
          b: self.candidate(b, target_epsilon, delta) for b in bands},
          describe_candidates(bands, self.max_bands, 'given'))
    evaluated: Dict[int, BandCandidate] = {}

    def evaluate(b: int) -> float:
      if b not in evaluated:
        evaluated[b] = self.candidate(b, target_epsilon, delta)
      return evaluated[b].rmse

    grid = coarse_grid(self.max_bands)
    for b in grid:
      evaluate(b)
    intervals = [(a, c) for a, c in zip(grid[:-1], grid[1:], strict=True) if c - a > 1]
    while intervals:
      # Most promising first (smallest objective at the ends), so the incumbent improves early.
      intervals.sort(key=lambda ac: -min(evaluated[ac[0]].rmse, evaluated[ac[1]].rmse))
      a, c = intervals.pop()
      best = min(candidate.rmse for candidate in evaluated.values())
      bound = self._sigma_lower_bound(
          self.sampling_prob(a + 1), amplification.num_compositions(self.num_rounds, c - 1),
          target_epsilon, delta) * self.loss(c)
      if bound * (1.0 + selection_rtol) >= best:
        continue
      mid = (a + c) // 2
      evaluate(mid)
      intervals.extend(ac for ac in ((a, mid), (mid, c)) if ac[1] - ac[0] > 1)
    return self._selection(target_epsilon, delta, evaluated,
                           describe_candidates(None, self.max_bands, 'branch and bound'))

  def _check_search_cost(self, bands: Optional[Tuple[int, ...]]) -> None:
    """`memory.ComputeLimitError` (a ValueError) when optimizing the strategies a search always
    evaluates (the given `bands`, or the coarse grid 1, 2, 4, ..., `max_bands`) would take longer
    than `memory.MAX_SECONDS` (`banded_optimizer.optimization_seconds`, a lower bound), naming
    what sets the bands."""
    if self._optimizer_options['max_seconds'] is not None:
      return  # each optimization has its own budget
    evaluated = coarse_grid(self.max_bands) if bands is None else bands
    seconds = sum(banded_optimizer.optimization_seconds(self.num_rounds, b) for b in evaluated)
    if bands is None:
      what = (f'the band selection over b-hat = 1 .. {self.max_bands} (min(floor(`dataset_size` / '
              f'`batch_size`), `num_rounds`) = min(floor({self.dataset_size} / {self.batch_size}), '
              f'{self.num_rounds})), which optimizes a BandMF strategy for at least b-hat = '
              f'{", ".join(map(str, evaluated))},')
      remedy = ('use a larger `batch_size`, fewer `num_rounds`, or `candidates` with fewer bands.')
    else:
      what = (f'`candidates` up to b-hat = {max(evaluated)} at `num_rounds`={self.num_rounds}, one '
              'BandMF optimization each,')
      remedy = 'give fewer or smaller `candidates`, or fewer `num_rounds`.'
    memory.check_seconds(seconds, what, remedy)

  def exhaustive(self, target_epsilon: float, delta: float) -> BandSelection:
    """Every b-hat in 1 .. `max_bands` (one optimization each; for small n)."""
    return self._selection(target_epsilon, delta, {
        b: self.candidate(b, target_epsilon, delta) for b in range(1, self.max_bands + 1)},
        describe_candidates(None, self.max_bands, 'exhaustive'))


def select_bands(target_epsilon: float, delta: float, num_rounds: int, dataset_size: int,
                 batch_size: int, *, error: str = 'rms', accountant: str = 'pld',
                 value_discretization_interval: Optional[float] = None,
                 rtol: float = SEARCH_RTOL, selection_rtol: float = 0.0,
                 max_iterations: int = 100, max_seconds: Optional[float] = None,
                 candidates=None) -> BandSelection:
  """The number of bands minimizing sigma(b-hat)^2 * L(b-hat) for (epsilon, delta, n, m, B).

  See `BandSelector` for the arguments and the search, `candidate_bands` for `candidates` (None:
  every b-hat; 'pow2': the paper's grid; or given values); use one selector for several targets.
  """
  selector = BandSelector(num_rounds, dataset_size, batch_size, error=error,
                          accountant=accountant,
                          value_discretization_interval=value_discretization_interval,
                          rtol=rtol, max_iterations=max_iterations, max_seconds=max_seconds)
  return selector.select(target_epsilon, delta, selection_rtol, candidates)
