"""Participation schemas: which sets of rounds one client may contribute to.

Conventions (see README, "Conventions"):
  * Rounds are 0-based: t = 0 .. n-1, with n = `num_rounds`.
  * `min_sep` = b: two participations of one client in rounds r1 < r2 satisfy r2 - r1 >= b (the BLT and
    BandMF papers' b-min-sep). The Gboard paper, the accounting colab and TF-Privacy's `min_separation`
    count the rounds *between* participations: min_separation = b - 1. This API accepts only `min_sep`.
  * `max_participations` = k; None means "as many as min_sep allows". The effective k for n rounds is
    min(k, ceil(n / b)).

Three schemas (BandMF paper Sec. 3, BLT paper Sec. 3.1), one class:
  * single participation: every client contributes to at most one round (min_sep=1, k=1 is the same);
  * b-min-sep with at most k participations (Definition 1 of the BandMF paper);
  * fixed-epoch (k, b)-participation: a client participates exactly in rounds j, j+b, ..., j+(k-1)b for
    some offset j in [0, b), as in multi-epoch training with a fixed data order.
"""

import dataclasses
import math
from typing import Optional, Tuple

from dp_ftrl_tff import _validation


@dataclasses.dataclass(frozen=True)
class ParticipationSchema:
  """How often, and how far apart, one client may participate.

  Attributes:
    min_sep: b >= 1, the minimum difference in round index between two participations of one client.
    max_participations: k >= 1, or None for ceil(n / b) (as many as `min_sep` allows).
    fixed_epoch: if True, the (k, b) fixed-epoch schema: participations are exactly b apart, at rounds
      j + i*b for one offset j in [0, b). Requires `max_participations`.
  """
  min_sep: int = 1
  max_participations: Optional[int] = None
  fixed_epoch: bool = False

  def __post_init__(self):
    _validation.check_positive_int(self.min_sep, 'min_sep')
    if self.max_participations is not None:
      _validation.check_positive_int(self.max_participations, 'max_participations')
    if not isinstance(self.fixed_epoch, bool):
      raise ValueError(f'`fixed_epoch` must be a bool, got {self.fixed_epoch!r}.')
    if self.fixed_epoch and self.max_participations is None:
      raise ValueError('`max_participations` must be given for a fixed-epoch schema.')

  @classmethod
  def single(cls) -> 'ParticipationSchema':
    """Each client participates in at most one round."""
    return cls(min_sep=1, max_participations=1)

  @classmethod
  def b_min_sep(cls, min_sep: int,
                max_participations: Optional[int] = None) -> 'ParticipationSchema':
    """b-min-sep participation (b = `min_sep`) with at most k = `max_participations` participations.
    """
    return cls(min_sep=min_sep, max_participations=max_participations)

  @classmethod
  def fixed_epoch_order(cls, num_epochs: int, rounds_per_epoch: int) -> 'ParticipationSchema':
    """(k, b)-participation: k = `num_epochs` epochs of b = `rounds_per_epoch` rounds each."""
    _validation.check_positive_int(num_epochs, 'num_epochs')
    _validation.check_positive_int(rounds_per_epoch, 'rounds_per_epoch')
    return cls(min_sep=rounds_per_epoch, max_participations=num_epochs, fixed_epoch=True)

  @property
  def tf_privacy_min_separation(self) -> int:
    """b - 1: TF-Privacy's `min_separation` (the Gboard tables' MinS, the colab's min_separation).

    Those count the rounds strictly *between* two participations of one client; `min_sep` = b counts
    r2 - r1.
    """
    return self.min_sep - 1

  def effective_max_participations(self, num_rounds: int) -> int:
    """k_eff = min(k, ceil(n / b)): the most participations possible in `num_rounds` rounds."""
    num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
    return _effective_max_participations(self, num_rounds)

  def is_single_participation(self, num_rounds: int) -> bool:
    """True when no client can participate twice within `num_rounds` rounds."""
    return self.effective_max_participations(num_rounds) == 1

  def earliest_pattern(self, num_rounds: int) -> Tuple[int, ...]:
    """pi* = (0, b, 2b, ..., (k_eff - 1) b): the worst case for non-increasing Toeplitz C (BLT Thm 3.1)."""
    k = self.effective_max_participations(num_rounds)
    return tuple(i * self.min_sep for i in range(k) if i * self.min_sep < num_rounds)

  def __str__(self) -> str:
    k = 'ceil(n/b)' if self.max_participations is None else self.max_participations
    kind = 'fixed-epoch' if self.fixed_epoch else 'min-sep'
    return f'{kind}(min_sep={self.min_sep}, max_participations={k})'


def _effective_max_participations(schema: ParticipationSchema, num_rounds: int) -> int:
  """min(k, ceil(n / b)) of a schema and a checked n."""
  possible = math.ceil(num_rounds / schema.min_sep)
  if schema.max_participations is None:
    return possible
  return min(schema.max_participations, possible)


@dataclasses.dataclass(frozen=True)
class RunSetting:
  """The setting a strategy is made for or checked against: n = `num_rounds` rounds under a
  `participation` schema (None: a run known only by its rounds, e.g. from its participation log).
  Checked when built."""
  num_rounds: int
  participation: Optional[ParticipationSchema] = None

  def __post_init__(self):
    object.__setattr__(self, 'num_rounds',
                       _validation.check_positive_int(self.num_rounds, 'num_rounds'))
    if self.participation is not None:
      check_participation(self.participation)

  @property
  def effective_max_participations(self) -> Optional[int]:
    """k_eff = min(k, ceil(n / b)) of the schema over the n rounds; None without a schema."""
    if self.participation is None:
      return None
    return _effective_max_participations(self.participation, self.num_rounds)


def check_participation(participation) -> ParticipationSchema:
  """Returns `participation`; raises ValueError unless it is a `ParticipationSchema`."""
  if not isinstance(participation, ParticipationSchema):
    raise ValueError(f'`participation` must be a ParticipationSchema, got {participation!r}.')
  return participation
