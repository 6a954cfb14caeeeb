"""Client sampling, one concept: the `Sampling` settings of a plan, the registry of sampler kinds,
the `Sampler` interface and `make_sampler`, which the data source (`programs.data_source`) calls.

Built-in kinds (the flag `--sampler`):
  * 'min_sep' (the default): exactly `clients_per_round` clients a round under the plan's declared
    b-min-sep participation with at most k participations (`learning.client_sampler`). Its
    parameters are the plan's: `clients_per_round`, `participation` (b, k), `num_rounds`.
  * 'poisson' and 'cyclic_poisson': random cohorts with inclusion probability q over b-hat groups
    (`learning.poisson_sampler`); their parameters are the `Sampling`'s.

A kind is a `SamplerKind` registry entry naming its `Sampler` class ('module:Class', imported only
when a sampler is made, so this module imports no TensorFlow). Adding a sampler = its module (a
`Sampler` subclass) + one `register` call (or a line in `_BUILT_IN`) + its tests.

A sampler's state is a flat dict of int64 numpy arrays (`Sampler.state`): the drivers' checkpoint
saves it as it is (`tff.program` state managers take such dicts) and the data source's iterator
packs the same dict into its bytes. Rounds are 0-based; `min_sep` = b (r2 - r1 >= b).
"""

import abc
import copy
import dataclasses
import importlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import _registry, _validation


@dataclasses.dataclass(frozen=True)
class SamplerKind:
  """A registry entry: one sampler kind.

  Attributes:
    name: the kind (`Sampling.kind`, the flag `--sampler`).
    sampler_class: 'module:Class' of its `Sampler` subclass.
    random_cohorts: True for random cohorts of expected size q * population / b-hat (they take
      `sampling_prob`, `num_groups` and `population` from the `Sampling`, and may be amplified);
      False for cohorts of exactly the plan's `clients_per_round` clients (no other setting).
    summary: one line for the help text.
  """
  name: str
  sampler_class: str
  random_cohorts: bool
  summary: str


_BUILT_IN = (
    SamplerKind('min_sep', 'dp_ftrl_tff.learning.client_sampler:ClientSampler', False,
                'exactly clients_per_round clients, b-min-sep, at most k participations'),
    SamplerKind('poisson', 'dp_ftrl_tff.learning.poisson_sampler:PoissonSampler', True,
                'each client independently with probability sampling_prob'),
    SamplerKind('cyclic_poisson', 'dp_ftrl_tff.learning.poisson_sampler:PoissonSampler', True,
                'Poisson draws within group t mod sampling_groups of fixed groups'),
)
_REGISTRY = _registry.Registry('kind', SamplerKind, 'SamplerKind', _BUILT_IN)
#: Adds a sampler kind (ValueError if its name is taken); removes one added; both for a block.
register, unregister, registered = _REGISTRY.register, _REGISTRY.unregister, _REGISTRY.registered
#: The registered kinds' names, built-in first; the registry entry of one (ValueError naming `kind`).
names, entry = _REGISTRY.names, _REGISTRY.entry


def sampler_class(name: str) -> type:
  """The `Sampler` subclass of kind `name`."""
  module, attribute = entry(name).sampler_class.split(':')
  return getattr(importlib.import_module(module), attribute)


#: The smallest inclusion probability q a plan takes: float64's machine epsilon, 2^-52 (about
#: 2.2e-16). The amplified guarantee of Poisson sampling (dp_accounting's privacy loss of a
#: subsampled Gaussian, log(1 - q + q e^x)) needs 1 - q to differ from 1: at q = 2^-53 the PLD
#: accountant failed ("deltas are not in non-increasing order") or divided by zero for noise
#: multipliers 0.5 and 1, and below it scipy overflowed ("a must be greater than b ... inf"); from
#: 2^-52 up it answered for noise multipliers 0.08 .. 100 and 1 .. 10^6 rounds (it reports epsilon 0
#: there: such a q samples no one in practice).
MIN_SAMPLING_PROB = 2.0**-52


def check_sampling_prob(sampling_prob, name: str = 'sampling_prob') -> float:
  """q as float; a ValueError naming `name` unless q lies in [`MIN_SAMPLING_PROB`, 1]."""
  q = _validation.check_float_in_range(sampling_prob, name, 0.0, 1.0, low_inclusive=False)
  if q < MIN_SAMPLING_PROB:
    raise ValueError(f'`{name}`={q:g} is below {MIN_SAMPLING_PROB:.3g} (2^-52, float64\'s machine '
                     'epsilon), the smallest probability whose amplified guarantee the accountant '
                     'computes: 1 - q rounds to 1 below it.')
  return q


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How a run's cohorts are drawn: its kind, and the settings of random cohorts.

  'poisson': in every round each of the `population` clients participates independently with
  probability q = `sampling_prob`. 'cyclic_poisson' (b-hat-cyclic Poisson, BandMF paper Alg. 2
  with Poisson draws, docs/papers.md): the population is split once into b-hat = `num_groups`
  fixed groups (the flag `--sampling_groups`), and round t (0-based) draws each member of group
  t mod b-hat independently with probability q, so a client's participations are b-hat rounds
  apart or more (min_sep = b-hat). Groups are as equal as possible: the first population mod
  b-hat groups have one client more. The realized cohort size is random (it may be 0); the mean
  divides by the fixed `expected_clients_per_round` = q * population / b-hat.

  A kind without random cohorts ('min_sep') takes no setting here: its cohort size and
  participation are the plan's.

  Attributes:
    kind: a registered kind (`names()`; the flag `--sampler`), 'min_sep' by default.
    sampling_prob: random cohorts: q in (0, 1], a client's inclusion probability in a round it is
      eligible for; else None.
    num_groups: b-hat >= 1 (1 for 'poisson' and kinds without random cohorts), at most
      `population`.
    population: random cohorts: the number of clients >= 1, or None in a plan made for accounting
      only (the amplified guarantee does not depend on it); else None (the plan's `population`).
  """
  kind: str = 'min_sep'
  sampling_prob: Optional[float] = None
  num_groups: int = 1
  population: Optional[int] = None

  def __post_init__(self):
    random_cohorts = entry(self.kind).random_cohorts
    object.__setattr__(self, 'num_groups',
                       _validation.check_positive_int(self.num_groups, 'num_groups'))
    if self.population is not None:
      object.__setattr__(self, 'population',
                         _validation.check_positive_int(self.population, 'population'))
    if not random_cohorts:
      for name, default in (('sampling_prob', None), ('num_groups', 1), ('population', None)):
        if getattr(self, name) != default:
          raise ValueError(f'`{name}` must be {default} for kind={self.kind!r} (its cohorts are '
                           f"the plan's clients_per_round), got {getattr(self, name)!r}.")
      return
    if self.sampling_prob is None:
      raise ValueError(f'`sampling_prob` is required for kind={self.kind!r}.')
    # Stored as a Python float, so `to_config` is JSON-ready whatever numpy type was passed.
    object.__setattr__(self, 'sampling_prob', check_sampling_prob(self.sampling_prob))
    if self.kind == 'poisson' and self.num_groups != 1:
      raise ValueError(f"`num_groups` must be 1 for kind='poisson', got {self.num_groups!r}.")
    if self.population is not None and self.num_groups > self.population:
      raise ValueError(f'`num_groups`={self.num_groups} exceeds the `population` of '
                       f'{self.population} clients: every group needs a client.')

  @property
  def random_cohorts(self) -> bool:
    """True for random cohorts (`SamplerKind.random_cohorts`)."""
    return entry(self.kind).random_cohorts

  @property
  def enforced_min_sep(self) -> int:
    """Random cohorts: the separation the sampler enforces between two participations of a
    client, b-hat."""
    return self.num_groups

  def group_sizes(self) -> list:
    """The b-hat group sizes (Python ints): the first population mod b-hat are one larger."""
    if self.population is None:
      raise ValueError('This sampling has no `population` (a plan made for accounting only).')
    base_size, remainder = divmod(self.population, self.num_groups)
    return [base_size + (1 if g < remainder else 0) for g in range(self.num_groups)]

  @property
  def expected_clients_per_round(self) -> Optional[float]:
    """q * population / b-hat: the fixed denominator of the mean (expected cohort size); None
    without a population or random cohorts."""
    if self.population is None or self.sampling_prob is None:
      return None
    return self.sampling_prob * self.population / self.num_groups

  def to_config(self) -> dict:
    return dataclasses.asdict(self)


class Sampler(abc.ABC):
  """Draws each round's cohort: `cohort = sampler.sample(t)` for t = 0, 1, 2, ... in order.

  The draw of round t is a pure function of (seed, population order, t, `state`), so a sampler
  restored with `load_state(state)` draws what an uninterrupted one draws. `state` is a flat dict of
  int64 numpy arrays (0-d for scalars) holding at least 'next_round'. A subclass keeps its ids and
  settings immutable: `copy` shares them and copies only the state.
  """

  @classmethod
  def check_cohorts(cls, population: int, clients_per_round: Optional[float], participation,
                    num_rounds: int) -> None:
    """Raises ValueError when no cohorts of this kind can fill `num_rounds` rounds of
    `clients_per_round` clients from `population` under `participation` (a
    `ParticipationSchema`): the settings' own check, before any plan or run directory is read.
    The default checks only the population: random cohorts fit any."""
    _validation.check_positive_int(population, 'population')

  @classmethod
  @abc.abstractmethod
  def from_plan(cls, client_ids: Sequence[str], plan, seed: int) -> 'Sampler':
    """The sampler of a trainable `plan.RunPlan` over `client_ids`, seeded by `seed`."""

  @classmethod
  @abc.abstractmethod
  def from_config(cls, client_ids: Sequence[str], config: dict) -> 'Sampler':
    """The sampler `config()` describes, at round 0."""

  @abc.abstractmethod
  def config(self) -> dict:
    """JSON-ready settings (seed included) that `from_config` rebuilds the sampler from."""

  @property
  @abc.abstractmethod
  def client_ids(self) -> List[str]:
    """The population, in the order the draws are made over."""

  @property
  @abc.abstractmethod
  def cohort_size(self) -> Optional[int]:
    """The number of clients every round draws, or None for random cohorts."""

  @property
  @abc.abstractmethod
  def next_round(self) -> int:
    """The 0-based round the next `sample` draws."""

  @abc.abstractmethod
  def sample(self, round_num: int) -> List[str]:
    """Draws and records the cohort of `round_num` (ValueError unless it is `next_round`)."""

  @property
  @abc.abstractmethod
  def state(self) -> Dict[str, np.ndarray]:
    """A copy of the state (safe to checkpoint)."""

  @abc.abstractmethod
  def load_state(self, state: Dict[str, np.ndarray]) -> None:
    """Restores a `state` of a sampler with the same settings (ValueError otherwise)."""

  def copy(self) -> 'Sampler':
    """An independent sampler at the same state."""
    copied = copy.copy(self)
    copied.load_state(self.state)
    return copied


def check_state_keys(state, keys: Tuple[str, ...]) -> Dict[str, np.ndarray]:
  """`state` as a dict of int64 arrays with exactly `keys`; ValueError naming `state` otherwise."""
  if not isinstance(state, dict) or set(state) != set(keys):
    got = sorted(state) if isinstance(state, dict) else type(state).__name__
    raise ValueError(f'`state` must be a dict with keys {sorted(keys)}, got {got}.')
  try:
    return {key: np.array(state[key], dtype=np.int64) for key in keys}
  except (TypeError, ValueError, OverflowError) as error:
    raise ValueError(f'`state` must hold integer arrays: {error}') from error


def make_sampler(client_ids: Sequence[str], plan, seed: int) -> Sampler:
  """The sampler of `plan.sampling`'s kind over `client_ids` (the population, in the order the
  draws are made over), seeded by `seed` (the drivers' `--seed`).

  Args:
    client_ids: unique client ids; as many as the plan's `population` when it is recorded.
    plan: a trainable `plan.RunPlan`.
    seed: non-negative int.

  Raises:
    ValueError: `plan` is not a plan, another population, or settings the kind's sampler refuses
      (e.g. an impossible min-sep schedule).
  """
  sampling = getattr(plan, 'sampling', None)
  if not isinstance(sampling, Sampling):
    raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {type(plan).__name__}.')
  client_ids = list(client_ids)
  if plan.population is not None and plan.population != len(client_ids):
    raise ValueError(f'`client_ids` holds {len(client_ids)} clients, but the plan\'s population '
                     f'is {plan.population}.')
  return sampler_class(sampling.kind).from_plan(client_ids, plan, seed)
