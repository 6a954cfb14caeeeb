"""The settings a run plan is made of: restarts, adaptive clipping and SecAgg.

`RestartSchedule` (when the noise starts a fresh segment), `AdaptiveClipping` (quantile clipping,
Gboard paper Alg. 1 / TFF's `gaussian_adaptive`, with the noise split `inflated_noise_multiplier`),
`SecureAggregation` (the SecAgg chain's settings and scale-factor arithmetic; the TensorFlow chain is
`aggregators.secure`); the sampling is `dp_ftrl_tff.sampling`'s. Each is a frozen,
validated dataclass named like the flags (`--target_unclipped_quantile`, `--clip_learning_rate`;
SecAgg's without their `secure_` prefix); the binaries name the flag in every error
(`experiments.cli.errors`). `dp_ftrl_tff.plan.RunPlan` holds them. Imports no TensorFlow.

Conventions (docs/papers.md): rounds are 0-based; noise multipliers are relative to the clip norm
and apply to the SUM of clipped updates.
"""

import dataclasses
import math
from typing import Optional, Tuple

import scipy.special

from dp_ftrl_tff import _validation

# ------------------------------------------------------------------------------------------------
# Restarts.


@dataclasses.dataclass(frozen=True)
class RestartSchedule:
  """The rounds at which the noise starts a fresh segment (0-based first rounds of a segment).

  Periodic: R = {warmup + period * i, i >= 0} without round 0. Gboard default (warmup 128, period
  1024): rounds 128, 1152, 2176, ..., the rounds at which TF-Privacy's
  `PeriodicRoundRestartIndicator(period=1024, warmup=128)` (used by TFF's `tree_adaptive`) fires.
  Explicit: `RestartSchedule.at(rounds)`, the given rounds (none: no restart at all).

  Round r in R is the FIRST round of a new mechanism segment (fresh noise stream; with adaptive
  clipping the clip takes the estimate).

  Attributes:
    warmup: first restart round (>= 0; 0 means the first restart is at round `period`), or None.
    period: rounds between restarts (>= 1), or None.
    rounds: the explicit restart rounds (sorted, distinct, >= 1), or None for a periodic schedule.
  """
  warmup: Optional[int] = None
  period: Optional[int] = None
  rounds: Optional[Tuple[int, ...]] = None

  def __post_init__(self):
    if self.rounds is None:
      _validation.check_nonnegative_int(self.warmup, 'warmup')
      _validation.check_positive_int(self.period, 'period')
      return
    if self.warmup is not None or self.period is not None:
      raise ValueError('`restart_rounds` excludes `restart_warmup` and `restart_period`.')
    if isinstance(self.rounds, (str, bytes)):
      raise ValueError(f'`restart_rounds` must be a sequence of rounds, got {self.rounds!r}.')
    rounds = tuple(sorted({_validation.check_positive_int(r, 'restart_rounds')
                           for r in self.rounds}))
    object.__setattr__(self, 'rounds', rounds)

  @classmethod
  def at(cls, rounds) -> 'RestartSchedule':
    """Restarts at exactly `rounds` (0-based, >= 1)."""
    return cls(rounds=tuple(rounds))

  @classmethod
  def of(cls, rounds, warmup: Optional[int], period: Optional[int]) -> Optional['RestartSchedule']:
    """The schedule of explicit restart `rounds`, or of `warmup` (default: the period) and
    `period`; None when none is given."""
    if rounds is not None:
      if warmup is not None or period is not None:
        raise ValueError('`restart_rounds` excludes `restart_warmup` and `restart_period`.')
      return cls.at(rounds)
    if period is None:
      if warmup is not None:
        raise ValueError('`restart_warmup` needs `restart_period`.')
      return None
    return cls(warmup=period if warmup is None else warmup, period=period)

  def restart_rounds(self, num_rounds: int) -> list:
    """The restart rounds below `num_rounds` (Python ints)."""
    num_rounds = _validation.check_nonnegative_int(num_rounds, 'num_rounds')
    if self.rounds is not None:
      return [r for r in self.rounds if r < num_rounds]
    return [r for r in range(self.warmup, num_rounds, self.period) if r > 0]

  @property
  def max_segment_rounds(self) -> Optional[int]:
    """The longest segment: max(warmup, period), or None for explicit rounds (the last segment
    lasts until the end of the run)."""
    return None if self.rounds is not None else max(self.warmup, self.period)

  def to_config(self) -> dict:
    if self.rounds is not None:
      return {'rounds': list(self.rounds)}
    return {'warmup': self.warmup, 'period': self.period}

  @classmethod
  def from_config(cls, config: dict) -> 'RestartSchedule':
    if not isinstance(config, dict):
      raise ValueError(f'`restarts` must be a dict, got {config!r}.')
    if 'rounds' in config:
      return cls.at(config['rounds'])
    return cls(warmup=config.get('warmup'), period=config.get('period'))


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
    target_unclipped_quantile: gamma in [0, 1], the quantile of update norms to track (0.5; TFF's
      name).
    clip_learning_rate: eta_gamma >= 0 of the geometric update (0.2).
    initial_clip: C^0 > 0, or None to take the plan's `clip_norm` (else `DEFAULT_INITIAL_CLIP`).
    clipped_count_stddev: sigma_b >= 0, std of the noise on the clipped-count SUM; None means
      clients_per_round / 20 (0 when the noise multiplier is 0), TFF's default.
    restarts: the `RestartSchedule`; None means the mechanism's default (every round for iid
      Gaussian noise, `GBOARD_RESTARTS` otherwise).
  """
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  initial_clip: Optional[float] = None
  clipped_count_stddev: Optional[float] = None
  restarts: Optional[RestartSchedule] = None

  def __post_init__(self):
    _validation.check_float_in_range(self.target_unclipped_quantile, 'target_unclipped_quantile',
                                     0.0, 1.0)
    _validation.check_nonnegative_float(self.clip_learning_rate, 'clip_learning_rate')
    if self.initial_clip is not None:
      _validation.check_positive_float(self.initial_clip, 'initial_clip')
    if self.clipped_count_stddev is not None:
      _validation.check_nonnegative_float(self.clipped_count_stddev, 'clipped_count_stddev')
    if self.restarts is not None and not isinstance(self.restarts, RestartSchedule):
      raise ValueError(f'`restarts` must be a RestartSchedule or None, got {self.restarts!r}.')

  def to_config(self) -> dict:
    return {'target_unclipped_quantile': self.target_unclipped_quantile,
            'clip_learning_rate': self.clip_learning_rate, 'initial_clip': self.initial_clip,
            'clipped_count_stddev': self.clipped_count_stddev,
            'restarts': None if self.restarts is None else self.restarts.to_config()}

  @classmethod
  def from_config(cls, config: dict) -> 'AdaptiveClipping':
    """Inverse of `to_config`."""
    if not isinstance(config, dict):
      raise ValueError(f'`adaptive_clip` must be a dict, got {config!r}.')
    unknown = sorted(set(config) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f'`{unknown[0]}` is not a setting of adaptive clipping.')
    config = dict(config)
    if config.get('restarts') is not None:
      config['restarts'] = RestartSchedule.from_config(config['restarts'])
    return cls(**config)


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
#: Rotations before rounding; the flag `--secure_rotation` writes None as 'none'.
ROTATIONS = ('dft', 'hd', None)
#: Largest field: TFF rounds in float32.
MAX_SECURE_BITS = 22


@dataclasses.dataclass(frozen=True)
class SecureAggregation:
  """Settings of the SecAgg chain (`aggregators.secure`; docs/aggregators.md for choosing them).

  The scale factor 1 / gamma follows the sub-Gaussian heuristic of the distributed discrete Gaussian
  paper (Sec. 4.2, 4.4; docs/papers.md) without local noise: with k = `num_stddevs`, n clients and
  padded dimension d, 2^bits = 2 k sqrt(c^2 n^2 / d + gamma^2 n / 4) / gamma, so the sum of n
  flattened updates stays in the field with probability about 1 - modclip_prob. Without rotation
  nothing is flattened and the scale uses the worst case n (c / gamma + 1) <= 2^(bits - 1). Either
  way the scale is (a constant) / clip, capped at `MAX_SCALE_FACTOR`. The fields are the flags
  `--secure_bits`, `--secure_rotation`, `--secure_beta`, `--secure_modclip_prob` without the prefix.

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
    if self.bits > MAX_SECURE_BITS:
      raise ValueError(f'`bits` must be at most {MAX_SECURE_BITS} (TFF rounds in float32), got '
                       f'{self.bits!r}.')
    if self.rotation not in ROTATIONS:
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
      raise ValueError(f'`bits`={self.bits} is too small for `clients_per_round`={n:g}: the sum of '
                       'the rounded updates cannot fit in the 2^bits field; increase `bits`.')
    return scale

  def scale_factor(self, clip_norm: float, clients_per_round: float, dim: int) -> float:
    """1 / gamma: the scale applied before rounding for the clip `clip_norm`."""
    clip_norm = _validation.check_positive_float(clip_norm, 'clip_norm')
    return min(self.unit_scale_factor(clients_per_round, dim) / clip_norm, MAX_SCALE_FACTOR)

  def to_config(self) -> dict:
    return dataclasses.asdict(self)
