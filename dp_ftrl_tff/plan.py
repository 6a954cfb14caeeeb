"""The run plan: everything that determines a run's privacy guarantee, in one immutable object.

A `RunPlan` holds the mechanism (`strategy`, from `mechanisms.registry`), the accounted noise
multiplier sigma and its split between the model sum (z_Delta) and the clipped-count query (sigma_b)
under adaptive clipping, the clip, the restart schedule, the SecAgg settings and the banded policy
past `max_rounds`. It imports no TensorFlow. `aggregators.CorrelatedNoiseFactory.from_plan` builds the
aggregator from it, the drivers write it to the run directory (`save_plan`), and the accountant and the
report read it back (`load_plan`). `print(plan)` shows it all.

Also the home of the settings objects the plan is made of: `RestartSchedule`, `AdaptiveClipping`,
`SecureAggregation` (settings and the scale-factor arithmetic; the TensorFlow chain is in
`aggregators.secure`), and the adaptive-clipping noise split (`inflated_noise_multiplier`).

Conventions (docs/papers.md): rounds are 0-based; the noise multiplier is relative to the clip norm and
applies to the SUM of clipped updates; the mean divides by the fixed `clients_per_round`.
"""

import dataclasses
import json
import math
from typing import Optional

import numpy as np
import scipy.special

from dp_ftrl_tff import _atomic, _validation
from dp_ftrl_tff.mechanisms import base, registry

# ------------------------------------------------------------------------------------------------
# Restarts.


@dataclasses.dataclass(frozen=True)
class RestartSchedule:
  """Restart rounds R = {warmup + period * i, i >= 0} without round 0 (0-based first rounds).

  Round r in R is the FIRST round of a new mechanism segment (fresh noise stream; with adaptive
  clipping the clip takes the estimate). Gboard default (warmup 128, period 1024): rounds 128, 1152,
  2176, ..., the rounds at which TF-Privacy's `PeriodicRoundRestartIndicator(period=1024, warmup=128)`
  (used by TFF's `tree_adaptive`) fires.

  Attributes:
    warmup: first restart round (>= 0; 0 means the first restart is at round `period`).
    period: rounds between restarts (>= 1).
  """
  warmup: int
  period: int

  def __post_init__(self):
    _validation.check_nonnegative_int(self.warmup, 'warmup')
    _validation.check_positive_int(self.period, 'period')

  def restart_rounds(self, num_rounds: int) -> list:
    """The restart rounds below `num_rounds` (Python ints)."""
    num_rounds = _validation.check_nonnegative_int(num_rounds, 'num_rounds')
    return [r for r in range(self.warmup, num_rounds, self.period) if r > 0]

  @property
  def max_segment_rounds(self) -> int:
    """The longest segment: max(warmup, period) rounds."""
    return max(self.warmup, self.period)


#: Gboard Alg. 1 / TFF `tree_adaptive`: restarts at rounds 128 + 1024 i.
GBOARD_RESTARTS = RestartSchedule(warmup=128, period=1024)
#: Clip adopted every round: right for iid Gaussian noise, where every round is its own segment.
EVERY_ROUND = RestartSchedule(warmup=1, period=1)

# ------------------------------------------------------------------------------------------------
# Adaptive clipping.

#: TFF's default initial clip for adaptive clipping.
DEFAULT_INITIAL_CLIP = 0.1


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
  """Settings of adaptive quantile clipping (defaults: Gboard paper Alg. 1 / TFF).

  Attributes:
    target_quantile: gamma in [0, 1], the quantile of update norms to track (0.5).
    learning_rate: eta_gamma >= 0 of the geometric update (0.2).
    initial_clip: C^0 > 0, or None to take the plan's `clip_norm` (else `DEFAULT_INITIAL_CLIP`).
    clipped_count_stddev: sigma_b >= 0, std of the noise on the clipped-count SUM; None means
      clients_per_round / 20 (0 when the noise multiplier is 0), TFF's default.
    restarts: the `RestartSchedule`; None means the mechanism's default (every round for iid
      Gaussian noise, `GBOARD_RESTARTS` otherwise).
  """
  target_quantile: float = 0.5
  learning_rate: float = 0.2
  initial_clip: Optional[float] = None
  clipped_count_stddev: Optional[float] = None
  restarts: Optional[RestartSchedule] = None

  def __post_init__(self):
    _validation.check_float_in_range(self.target_quantile, 'target_quantile', 0.0, 1.0)
    _validation.check_nonnegative_float(self.learning_rate, 'learning_rate')
    if self.initial_clip is not None:
      _validation.check_positive_float(self.initial_clip, 'initial_clip')
    if self.clipped_count_stddev is not None:
      _validation.check_nonnegative_float(self.clipped_count_stddev, 'clipped_count_stddev')
    if self.restarts is not None and not isinstance(self.restarts, RestartSchedule):
      raise ValueError(f'`restarts` must be a RestartSchedule or None, got {self.restarts!r}.')


def inflated_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float) -> float:
  """z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): the model-sum multiplier under adaptive clipping.

  Each round releases the clipped sum (multiplier z_Delta on the clip) and the centred clipped-count
  sum (sensitivity 1/2, noise std sigma_b); their zCDP adds, so the round is as private as one
  Gaussian release with multiplier z when 1 / z^2 = 1 / z_Delta^2 + 1 / (2 sigma_b)^2 (Gboard paper
  Thm. 1, docs/papers.md). This is TFF's `differential_privacy.adaptive_clip_noise_params`, repeated
  here because this layer must import without TensorFlow (a test checks the two agree).

  Raises:
    ValueError: naming the bad parameter, if a value is not positive or z >= 2 sigma_b (then no value
      noise achieves z).
  """
  z = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  sigma_b = _validation.check_positive_float(clipped_count_stddev, 'clipped_count_stddev')
  if z >= 2.0 * sigma_b:
    raise ValueError(f'`noise_multiplier`={z!r} must be smaller than 2 * `clipped_count_stddev` '
                     f'= {2.0 * sigma_b!r}; otherwise no value noise achieves it.')
  return float((z**-2 - (2.0 * sigma_b)**-2)**-0.5)


def accounted_noise_multiplier(value_noise_multiplier: float, clipped_count_stddev: float) -> float:
  """z = (z_Delta^-2 + (2 sigma_b)^-2)^(-1/2): the inverse of `inflated_noise_multiplier`."""
  z_delta = _validation.check_positive_float(value_noise_multiplier, 'value_noise_multiplier')
  sigma_b = _validation.check_positive_float(clipped_count_stddev, 'clipped_count_stddev')
  return float(1.0 / math.sqrt(z_delta**-2 + (2.0 * sigma_b)**-2))

# ------------------------------------------------------------------------------------------------
# SecAgg.

#: TFF's cap on the scale factor (float32 arithmetic in the rounding overflows above it).
MAX_SCALE_FACTOR = 1e6
_ROTATIONS = ('dft', 'hd', None)


@dataclasses.dataclass(frozen=True)
class SecureAggregation:
  """Settings of the SecAgg chain (`aggregators.secure`; docs/aggregators.md for choosing them).

  The scale factor 1 / gamma follows the sub-Gaussian heuristic of the distributed discrete Gaussian
  paper (Sec. 4.2, 4.4; docs/papers.md) without local noise: with k = `num_stddevs`, n clients and
  padded dimension d, 2^bits = 2 k sqrt(c^2 n^2 / d + gamma^2 n / 4) / gamma, so the sum of n
  flattened updates stays in the field with probability about 1 - modclip_prob. Without rotation
  nothing is flattened and the scale uses the worst case n (c / gamma + 1) <= 2^(bits - 1). Either
  way the scale is (a constant) / clip, capped at `MAX_SCALE_FACTOR`.

  Attributes:
    bits: field size 2^bits of the secure sum, 1 <= bits <= 22 (TFF's float32 limit).
    rotation: 'dft' (discrete Fourier transform, pads at most one zero), 'hd' (randomized Hadamard,
      pads to a power of 2) or None (no flattening; worst-case scale).
    beta: conditional stochastic rounding bias in [0, 1) (0 = unconditional; DDG paper Sec. 4.1).
    modclip_prob: target probability of a modular wrap of an aggregate coordinate, in (0, 1).
  """
  bits: int = 20
  rotation: Optional[str] = 'dft'
  beta: float = 0.0
  modclip_prob: float = 1e-4

  def __post_init__(self):
    _validation.check_positive_int(self.bits, 'bits')
    if self.bits > 22:
      raise ValueError(f'`bits` must be at most 22 (float32 arithmetic), got {self.bits!r}.')
    if self.rotation not in _ROTATIONS:
      raise ValueError(f"`rotation` must be 'dft', 'hd' or None, got {self.rotation!r}.")
    _validation.check_float_in_range(self.beta, 'beta', 0.0, 1.0, high_inclusive=False)
    _validation.check_float_in_range(self.modclip_prob, 'modclip_prob', 0.0, 1.0,
                                     low_inclusive=False, high_inclusive=False)

  def padded_dim(self, dim: int) -> int:
    """Length of the flattened vector the secure sum sees for a `dim`-coordinate update."""
    dim = _validation.check_positive_int(dim, 'dim')
    if self.rotation == 'hd':
      return 2**math.ceil(math.log2(dim))
    if self.rotation == 'dft':
      return 2 * math.ceil(dim / 2)
    return dim

  @property
  def num_stddevs(self) -> float:
    """k: the field spans +-k standard deviations of the aggregate (two-sided tail modclip_prob)."""
    return math.sqrt(2.0) * float(scipy.special.erfcinv(self.modclip_prob))

  def unit_scale_factor(self, clients_per_round: float, dim: int) -> float:
    """The scale for a clip of 1, before the `MAX_SCALE_FACTOR` cap; the scale is this / clip."""
    n = _validation.check_positive_float(clients_per_round, 'clients_per_round')
    d = self.padded_dim(dim)
    field = 2.0**self.bits
    if self.rotation is None:
      scale = field / 2.0 / n - 1.0
    else:
      k = self.num_stddevs
      scale = math.sqrt(max(field**2 - n * k**2, 0.0)) / (2.0 * k * n / math.sqrt(d))
    if scale <= 0:
      raise ValueError(f'`bits`={self.bits} is too small for {n:g} clients per round: the sum '
                       'cannot fit in the field. Increase `bits`.')
    return scale

  def scale_factor(self, clip_norm: float, clients_per_round: float, dim: int) -> float:
    """1 / gamma: the scale applied before rounding for the clip `clip_norm`."""
    clip_norm = _validation.check_positive_float(clip_norm, 'clip_norm')
    return min(self.unit_scale_factor(clients_per_round, dim) / clip_norm, MAX_SCALE_FACTOR)

  def to_config(self) -> dict:
    return dataclasses.asdict(self)

# ------------------------------------------------------------------------------------------------
# Client sampling.

SAMPLING_KINDS = ('poisson', 'cyclic_poisson')


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Random client sampling with independent per-client coins (the samplers in `learning.samplers`).

  'poisson': in every round each of the `population` clients participates independently with
  probability q = `sampling_prob`. 'cyclic_poisson' (b-hat-cyclic Poisson, BandMF paper Alg. 2 with
  Poisson draws, docs/papers.md): the population is split once into b-hat = `num_groups` fixed groups,
  and round t (0-based) draws each member of group t mod b-hat independently with probability q, so a
  client's participations are b-hat rounds apart or more (min_sep = b-hat).

  Groups are as equal as possible: the first population mod b-hat groups have one client more than the
  others. The realized cohort size is random (it may be 0); the mean divides by the fixed
  `expected_clients_per_round` = q * population / b-hat, the expected cohort size averaged over the
  b-hat rounds of a cycle (so with a remainder, rounds of a larger group expect q more clients).

  Attributes:
    kind: 'poisson' or 'cyclic_poisson'.
    sampling_prob: q in (0, 1], a client's inclusion probability in a round it is eligible for.
    num_groups: b-hat >= 1 (1 for 'poisson'), at most `population`.
    population: number of clients >= 1.
  """
  kind: str
  sampling_prob: float
  num_groups: int
  population: int

  def __post_init__(self):
    _validation.check_one_of(self.kind, 'kind', SAMPLING_KINDS)
    # Stored as Python scalars, so `to_config` is JSON-ready whatever numpy types were passed.
    object.__setattr__(self, 'sampling_prob', _validation.check_float_in_range(
        self.sampling_prob, 'sampling_prob', 0.0, 1.0, low_inclusive=False))
    object.__setattr__(self, 'num_groups',
                       _validation.check_positive_int(self.num_groups, 'num_groups'))
    object.__setattr__(self, 'population',
                       _validation.check_positive_int(self.population, 'population'))
    if self.kind == 'poisson' and self.num_groups != 1:
      raise ValueError(f"`num_groups` must be 1 for kind='poisson', got {self.num_groups!r}.")
    if self.num_groups > self.population:
      raise ValueError(f'`num_groups`={self.num_groups} exceeds the `population` of '
                       f'{self.population} clients: every group needs a client.')

  def group_sizes(self) -> list:
    """The b-hat group sizes (Python ints): the first population mod b-hat are one larger."""
    base_size, remainder = divmod(self.population, self.num_groups)
    return [base_size + (1 if g < remainder else 0) for g in range(self.num_groups)]

  @property
  def expected_clients_per_round(self) -> float:
    """q * population / b-hat: the fixed denominator of the mean (expected cohort size)."""
    return self.sampling_prob * self.population / self.num_groups

  def to_config(self) -> dict:
    return dataclasses.asdict(self)


# ------------------------------------------------------------------------------------------------
# The plan.

_BEYOND_MAX_ROUNDS = ('error', 'restart')


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """What a run releases and how it is noised; see the module docstring. Build with `RunPlan.build`.

  Attributes:
    strategy: the mechanism's `Strategy` (its `name` is the registry key).
    noise_multiplier: sigma >= 0, the accounted noise multiplier (relative to the clip, on the sum).
    clients_per_round: m > 0, the fixed denominator of the mean.
    clip_norm: zeta > 0, the fixed clip, or the initial clip with adaptive clipping.
    adaptive_clip: `AdaptiveClipping` settings, or None for a fixed clip.
    clipped_count_stddev: sigma_b with adaptive clipping (resolved default), else None.
    value_noise_multiplier: z_Delta, the multiplier on the model sum (= sigma without adaptive
      clipping; `inflated_noise_multiplier` with it; 0 when sigma is 0).
    restarts: the `RestartSchedule` of the mechanism segments, or None (one segment).
    secure: `SecureAggregation` settings, or None (plain sum).
    zeroing_norm: updates with a larger L2 norm are zeroed; None zeroes only non-finite updates.
    beyond_max_rounds: banded strategies past their `max_rounds`: 'error' or 'restart'.
    sampling: the random `Sampling` of the cohorts (then `clients_per_round` is its
      `expected_clients_per_round`), or None: min-sep sampling of exactly `clients_per_round`
      clients, accounted with the declared participation schema.
  """
  strategy: base.Strategy
  noise_multiplier: float
  clients_per_round: float
  clip_norm: float
  adaptive_clip: Optional[AdaptiveClipping]
  clipped_count_stddev: Optional[float]
  value_noise_multiplier: float
  restarts: Optional[RestartSchedule]
  secure: Optional[SecureAggregation]
  zeroing_norm: Optional[float]
  beyond_max_rounds: str = 'error'
  sampling: Optional[Sampling] = None

  @classmethod
  def build(cls, strategy: base.Strategy, noise_multiplier: float,
            clients_per_round: Optional[float], clip_norm: Optional[float], *, adaptive_clip=None,
            secure=None, zeroing_norm: Optional[float] = None,
            restarts: Optional[RestartSchedule] = None, beyond_max_rounds: str = 'error',
            sampling: Optional[Sampling] = None) -> 'RunPlan':
    """Validates the arguments and resolves every default into a plan.

    Args:
      strategy: a registered `Strategy` with a streaming noise state.
      noise_multiplier: sigma >= 0.
      clients_per_round: m > 0; with `sampling`, None or its `expected_clients_per_round`.
      clip_norm: the fixed clip; with `adaptive_clip` the initial clip, or None.
      adaptive_clip: None or False (fixed clip), True (Gboard defaults) or an `AdaptiveClipping`.
      secure: None (plain sum), an int number of bits, or a `SecureAggregation`.
      zeroing_norm: > 0 or None.
      restarts: a `RestartSchedule`, or None: the adaptive clipping's schedule, else its mechanism
        default (`EVERY_ROUND` for Gaussian noise, `GBOARD_RESTARTS` otherwise) with adaptive
        clipping, and no restarts with a fixed clip.
      beyond_max_rounds: 'error' or 'restart' (banded strategies).
      sampling: a `Sampling` (Poisson or cyclic Poisson cohorts), or None (min-sep sampling).
    """
    if not isinstance(strategy, base.Strategy):
      raise ValueError(f'`strategy` must be a dp_ftrl_tff.mechanisms Strategy, got {strategy!r}.')
    if not registry.get(strategy.name).streams:
      raise ValueError(f'`strategy` {strategy.name!r} has no streaming noise; streaming mechanisms: '
                       f'{list(registry.names(streaming_only=True))}.')
    sigma = _validation.check_nonnegative_float(noise_multiplier, 'noise_multiplier')
    if sampling is not None and not isinstance(sampling, Sampling):
      raise ValueError(f'`sampling` must be a Sampling or None, got {sampling!r}.')
    if sampling is not None and clients_per_round is None:
      clients_per_round = sampling.expected_clients_per_round
    m = _validation.check_positive_float(clients_per_round, 'clients_per_round')
    if sampling is not None and not math.isclose(m, sampling.expected_clients_per_round,
                                                 rel_tol=1e-12):
      raise ValueError(f'`clients_per_round`={m!r} conflicts with `sampling`: the mean divides by '
                       f'the expected cohort size {sampling.expected_clients_per_round!r} (q * '
                       'population / num_groups); pass None.')
    if zeroing_norm is not None:
      zeroing_norm = _validation.check_positive_float(zeroing_norm, 'zeroing_norm')
    if restarts is not None and not isinstance(restarts, RestartSchedule):
      raise ValueError(f'`restarts` must be a RestartSchedule or None, got {restarts!r}.')
    _validation.check_one_of(beyond_max_rounds, 'beyond_max_rounds', _BEYOND_MAX_ROUNDS)
    if adaptive_clip is True:
      adaptive_clip = AdaptiveClipping()
    elif adaptive_clip is False:
      adaptive_clip = None
    if adaptive_clip is not None and not isinstance(adaptive_clip, AdaptiveClipping):
      raise ValueError(f'`adaptive_clip` must be None, a bool or an AdaptiveClipping, got '
                       f'{adaptive_clip!r}.')
    count_stddev = None
    value_sigma = sigma
    if adaptive_clip is None:
      if clip_norm is None:
        raise ValueError('`clip_norm` is required without `adaptive_clip`.')
      clip_norm = _validation.check_positive_float(clip_norm, 'clip_norm')
    else:
      if clip_norm is not None:
        clip_norm = _validation.check_positive_float(clip_norm, 'clip_norm')
        if adaptive_clip.initial_clip is not None and adaptive_clip.initial_clip != clip_norm:
          raise ValueError(f'`clip_norm`={clip_norm!r} conflicts with `adaptive_clip.initial_clip`'
                           f'={adaptive_clip.initial_clip!r}; give only one.')
      clip_norm = float(adaptive_clip.initial_clip or clip_norm or DEFAULT_INITIAL_CLIP)
      count_stddev = adaptive_clip.clipped_count_stddev
      if sigma == 0.0:
        count_stddev = float(count_stddev or 0.0)
      else:
        count_stddev = float(m / 20.0 if count_stddev is None else count_stddev)
        value_sigma = inflated_noise_multiplier(sigma, count_stddev)
      default = GBOARD_RESTARTS if strategy.correlated else EVERY_ROUND
      restarts = restarts or adaptive_clip.restarts or default
    if isinstance(secure, bool):
      raise ValueError(f'`secure` must be None, an int number of bits or a SecureAggregation, got '
                       f'{secure!r}.')
    if isinstance(secure, (int, np.integer)):
      secure = SecureAggregation(bits=int(secure))
    if secure is not None and not isinstance(secure, SecureAggregation):
      raise ValueError(f'`secure` must be None, an int number of bits or a SecureAggregation, got '
                       f'{secure!r}.')
    return cls(strategy=strategy, noise_multiplier=sigma, clients_per_round=m, clip_norm=clip_norm,
               adaptive_clip=adaptive_clip, clipped_count_stddev=count_stddev,
               value_noise_multiplier=value_sigma, restarts=restarts, secure=secure,
               zeroing_norm=zeroing_norm, beyond_max_rounds=beyond_max_rounds, sampling=sampling)

  @property
  def mechanism(self) -> str:
    """The registry name of the strategy."""
    return self.strategy.name

  @property
  def max_segment_rounds(self) -> Optional[int]:
    """The longest noise segment between restarts, or None without restarts."""
    return None if self.restarts is None else self.restarts.max_segment_rounds

  def restart_rounds(self, num_rounds: int) -> list:
    """The scheduled restart rounds below `num_rounds` (banded 'restart' segments add theirs)."""
    rounds = set() if self.restarts is None else set(self.restarts.restart_rounds(num_rounds))
    max_rounds = self.strategy.max_rounds
    if self.beyond_max_rounds == 'restart' and max_rounds is not None:
      rounds.update(range(max_rounds, num_rounds, max_rounds))
    return sorted(rounds)

  def to_config(self) -> dict:
    """JSON-ready description (arrays of the strategy as nested lists); `from_config` inverts it."""
    strategy = {key: value.tolist() if isinstance(value, np.ndarray) else value
                for key, value in self.strategy.to_config().items()}
    return {
        'strategy': strategy,
        'noise_multiplier': self.noise_multiplier,
        'value_noise_multiplier': self.value_noise_multiplier,
        'clients_per_round': self.clients_per_round,
        'clip_norm': self.clip_norm,
        'adaptive_clip': (None if self.adaptive_clip is None
                          else dataclasses.asdict(self.adaptive_clip)),
        'clipped_count_stddev': self.clipped_count_stddev,
        'restarts': None if self.restarts is None else dataclasses.asdict(self.restarts),
        'secure': None if self.secure is None else self.secure.to_config(),
        'zeroing_norm': self.zeroing_norm,
        'beyond_max_rounds': self.beyond_max_rounds,
        'sampling': None if self.sampling is None else self.sampling.to_config(),
    }

  @classmethod
  def from_config(cls, config: dict) -> 'RunPlan':
    """Inverse of `to_config`: rebuilds the plan through `build` (so it is validated again)."""
    if not isinstance(config, dict):
      raise ValueError(f'`config` must be a dict, got {type(config).__name__}.')
    missing = sorted({'strategy', 'noise_multiplier', 'clients_per_round', 'clip_norm'} - set(config))
    if missing:
      raise ValueError(f'The plan config lacks {missing}.')
    strategy_config = dict(config['strategy'])
    for key, value in strategy_config.items():
      if isinstance(value, list) and value and isinstance(value[0], list):
        strategy_config[key] = np.asarray(value, np.float64)
    adaptive = config.get('adaptive_clip')
    if adaptive is not None:
      adaptive = dict(adaptive)
      if adaptive.get('restarts') is not None:
        adaptive['restarts'] = RestartSchedule(**adaptive['restarts'])
      adaptive = AdaptiveClipping(**adaptive)
    restarts = config.get('restarts')
    secure = config.get('secure')
    sampling = config.get('sampling')  # absent from the plans of earlier releases: min-sep
    return cls.build(
        registry.strategy_from_config(strategy_config), config['noise_multiplier'],
        config['clients_per_round'], config['clip_norm'], adaptive_clip=adaptive,
        secure=None if secure is None else SecureAggregation(**secure),
        zeroing_norm=config.get('zeroing_norm'),
        restarts=None if restarts is None else RestartSchedule(**restarts),
        beyond_max_rounds=config.get('beyond_max_rounds', 'error'),
        sampling=None if sampling is None else Sampling(**sampling))

  def __str__(self) -> str:
    lines = [f'RunPlan: {self.mechanism} {self.strategy!r}',
             f'  noise_multiplier sigma={self.noise_multiplier:g} (value z_Delta='
             f'{self.value_noise_multiplier:.10g}), clients_per_round={self.clients_per_round:g}',
             f'  clip: {"adaptive " + repr(self.adaptive_clip) if self.adaptive_clip else "fixed"}'
             f' clip_norm={self.clip_norm:g}, clipped_count_stddev={self.clipped_count_stddev}',
             f'  restarts={self.restarts}, beyond_max_rounds={self.beyond_max_rounds}',
             f'  secure={self.secure}, zeroing_norm={self.zeroing_norm}',
             '  sampling=' + ('None (min-sep sampler, declared participation schema)'
                              if self.sampling is None else str(self.sampling))]
    return '\n'.join(lines)


def save_plan(plan: RunPlan, path) -> None:
  """Writes `plan.to_config()` as JSON to `path` (via a temp file, renamed into place)."""
  if not isinstance(plan, RunPlan):
    raise ValueError(f'`plan` must be a RunPlan, got {type(plan).__name__}.')
  _atomic.write_text(path, json.dumps(plan.to_config(), indent=2, allow_nan=False) + '\n')


def load_plan(path) -> RunPlan:
  """The plan `save_plan` wrote to `path`; ValueError naming the file when it is not one."""
  try:
    with open(path) as f:
      config = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f'`path` {path!r} is not a readable plan file: {e}') from e
  return RunPlan.from_config(config)
