"""A `tff.program.FederatedDataSource` whose rounds are drawn by the plan's client sampler.

`SampledClientDataSource` selects each round's cohort of a client-id population (a sequence of ids
or a `tff.simulation.datasets.ClientData`) with the plan's sampler (`sampling.make_sampler`),
returns client ids as `tff.program.ClientIdDataSource` does and appends the cohort to
the participation log, so `tff.learning.programs.train_model` can train on it and the privacy
report can read the log. Rounds are 0-based: `train_model`'s round j (1-based) selects t = j - 1.

Restart contract. The iterator's bytes (`to_bytes`) hold all TFF's restore
(`type(template).from_bytes(bytes)`) needs: the population, the sampler's kind, `config` and
`state` (the sampler's, its seed included), the log's path, the byte offset of the next round's
rows and the plan the draws were made for (`plan`: its `to_config(fingerprint_arrays=True)`). Draws
are a pure function of (seed, population order, round, state) and `select` cuts the log back to the
offset before appending, so a restored program (whatever was written after its save) and a round
`train_model` discards select and log what an uninterrupted program does, byte for byte. Nothing
here truncates the log before a `select`: a program must refuse to start fresh over an old run's
log.

The plan binds the iterator. `SampledClientDataSource.iterator()` is of a class bound to its data
source, so any program state manager that restores it as TFF's do (`type(template).from_bytes`,
`tff.program.FileProgramStateManager` among them) continues the saved draws through
`SampledClientDataSource.resume`: under the data source's own rounds and log path (a run trained
on with more rounds, or moved), and only if the data source has the population, the seed and the
plan the saved draws were made for, but for the fields a run may change when it resumes
(`plan.RESUMABLE_FIELDS`). Any other change (the noise multiplier, the clip, the mechanism or its
options, the participation schema, the cohort, the sampler, the restarts, adaptive clipping) is a
ValueError naming it, before any round: a run resumed under another plan would report a guarantee
its earlier rounds do not have. `SampledClientDataSourceIterator.from_bytes` itself (the unbound
class) restores the saved draws under their own plan.

Bytes (version 3): b'DPFTRLIT' | u16 version (little-endian) | SHA-256 of the body (32 bytes) |
body: ASCII JSON {sampler (the kind), config, num_rounds, participation_log (absolute),
log_offset, client_ids, state: {name: int or nested list}, plan}.
"""

import hashlib
import json
import numbers
import os
import struct
from collections.abc import Sequence
from typing import List, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling, stopping
from dp_ftrl_tff.accounting import participation_log as participation_log_lib

_MAGIC = b'DPFTRLIT'
FORMAT_VERSION = 3
_PREFIX = struct.Struct('<8sH32s')  # magic, version, SHA-256 of the body
_FIELDS = ('sampler', 'config', 'num_rounds', 'participation_log', 'log_offset', 'client_ids',
           'state', 'plan')
# Byte offset of round 0's rows: just past the header line.
_FIRST_OFFSET = len(participation_log_lib.HEADER_BYTES)


class DataSourceTypeError(TypeError, ValueError):
  """A wrong-typed argument: a TypeError (TFF's data sources) and a ValueError (the project's)."""


class _Shared(NamedTuple):
  """What a data source and its iterators share (immutable)."""
  client_ids: Tuple[str, ...]  # the population, in the order the draws are made over
  sampler: str  # the plan's `Sampling.kind`
  num_rounds: Optional[int]  # the plan's
  participation_log: str  # absolute
  plan: str  # `_plan_binding`: the plan the draws are made for, as sorted JSON


def _population_ids(population) -> Tuple[str, ...]:
  """The client ids of `population`, in its order (the sampler checks they are unique)."""
  if isinstance(population, tff.simulation.datasets.ClientData):
    population = population.client_ids
  if (not isinstance(population, Sequence) or isinstance(population, str)
      or not all(isinstance(client_id, str) for client_id in population)):
    raise DataSourceTypeError('`population` must be a sequence of client ids (str) or a '
                              f'tff.simulation.datasets.ClientData, got {population!r:.80}.')
  return tuple(population)


class _Selection:
  """`_shared` and a `_sampler` (the data source's at round 0, the iterator's current)."""

  def _build(self, population, plan: plan_lib.RunPlan, participation_log, seed) -> None:
    if not isinstance(participation_log, (str, os.PathLike)) or not os.fspath(participation_log):
      raise ValueError(f'`participation_log` must be a non-empty path, got {participation_log!r}.')
    client_ids = _population_ids(population)
    self._sampler = sampling.make_sampler(client_ids, plan, seed)  # checks the plan
    path = os.path.abspath(os.fspath(participation_log))
    self._shared = _Shared(client_ids, plan.sampling.kind, plan.num_rounds, path,
                           _plan_binding(plan))
    participation_log_lib.ParticipationLogWriter(path)  # creates the log or checks its header

  @property
  def federated_type(self) -> tff.FederatedType:
    """`{str}@CLIENTS`, as `tff.program.ClientIdDataSource`: one client id per client."""
    return tff.FederatedType(np.str_, tff.CLIENTS)

  @property
  def client_ids(self) -> Tuple[str, ...]:
    """The population, in the order the draws are made over."""
    return self._shared.client_ids

  @property
  def participation_log(self) -> str:
    """The absolute path of the participation log."""
    return self._shared.participation_log


class SampledClientDataSourceIterator(_Selection, tff.program.FederatedDataSourceIterator):
  """Selects and logs round after round of client ids (module docstring). Made by
  `SampledClientDataSource.iterator()`, restored by `from_bytes`, or built at round 0 by the
  constructor (the data source's arguments)."""

  #: The data source whose iterators this class restores (`from_bytes`), or None: set on the class
  #: each data source makes for its iterators (`SampledClientDataSource.iterator`).
  _source: Optional['SampledClientDataSource'] = None

  def __init__(self, population, plan: plan_lib.RunPlan, participation_log: str, seed: int):
    self._build(population, plan, participation_log, seed)
    self._offset = _FIRST_OFFSET

  @classmethod
  def _of(cls, shared: _Shared, sampler, offset: int) -> 'SampledClientDataSourceIterator':
    iterator = cls.__new__(cls)
    iterator._shared, iterator._sampler, iterator._offset = shared, sampler, offset
    return iterator

  @property
  def sampler_kind(self) -> str:
    """The plan's `Sampling.kind`."""
    return self._shared.sampler

  @property
  def next_round(self) -> int:
    """The 0-based round the next `select` draws (= the rounds selected so far)."""
    return self._sampler.next_round

  @property
  def log_offset(self) -> int:
    """The byte offset of the log where the next round's rows start."""
    return self._offset

  def select(self, k: Optional[int] = None) -> List[str]:
    """Draws the next round's cohort, writes it to the log at the held offset, and returns it.
    `k` (`train_per_round_clients`) is an int in [0, population], the size of fixed cohorts.
    DataSourceTypeError for a non-int `k`; ValueError (the iterator unchanged) for a bad `k`, a
    round past `num_rounds`, a log missing or shorter than the offset. It first calls
    `dp_ftrl_tff.stopping.check()`: a program's installed check stops train_model here, between
    rounds (the iterator unchanged)."""
    stopping.check()
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
      raise DataSourceTypeError(f'`k` must be an int, got {k!r}.')
    (client_ids, kind, num_rounds, path, _), size = self._shared, self._sampler.cohort_size
    population = len(client_ids)
    if k is None or k < 0 or k > population:
      raise ValueError(f'`k` must be an integer in [0, {population}] (the population), got {k!r}.')
    if size is not None and k != size:
      raise ValueError(f'`k`={k}, but the {kind} sampler draws exactly {size} clients: give '
                       f'train_model train_per_round_clients={size}.')
    round_num = self.next_round
    if num_rounds is not None and round_num >= num_rounds:
      raise ValueError(f'All `num_rounds`={num_rounds} rounds were selected; the schedule has no '
                       'further round.')
    if not os.path.isfile(path):
      raise ValueError(f'The participation log {path} is missing (the iterator is at round '
                       f'{round_num}, byte {self._offset}).')
    # Draw on a copy; commit only once the log write succeeded.
    sampler = self._sampler.copy()
    cohort = sampler.sample(round_num)
    writer = participation_log_lib.ParticipationLogWriter(path)
    self._offset = writer.append_round_at(self._offset, round_num, cohort)
    self._sampler = sampler
    return cohort

  def to_bytes(self) -> bytes:
    """The iterator as self-contained bytes (format in the module docstring)."""
    body = json.dumps({
        **self._shared._asdict(), 'client_ids': list(self._shared.client_ids),
        'plan': json.loads(self._shared.plan),
        'config': self._sampler.config(), 'log_offset': self._offset,
        'state': {k: v.tolist() for k, v in self._sampler.state.items()}}).encode('ascii')
    return _PREFIX.pack(_MAGIC, FORMAT_VERSION, hashlib.sha256(body).digest()) + body

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'SampledClientDataSourceIterator':
    """Rebuilds an iterator from `to_bytes` output; touches no file (the log is read at `select`).
    The class of a data source's iterators (`SampledClientDataSource.iterator`) continues it with
    that data source (`SampledClientDataSource.resume`: the same population, seed and plan, but for
    `plan.RESUMABLE_FIELDS`); this class restores it as it was saved.
    ValueError (naming what is wrong) for `buffer` not bytes, truncated, of another format or
    version, failing its checksum, or holding sampler settings or a state the sampler refuses, or
    (a data source's class) draws of another population, seed or plan."""
    fields = _unpack(buffer)
    try:
      client_ids = _population_ids(fields['client_ids'])
      sampler = sampling.sampler_class(fields['sampler']).from_config(client_ids, fields['config'])
      sampler.load_state({k: np.asarray(v, dtype=np.int64) for k, v in fields['state'].items()})
    except (TypeError, ValueError, AttributeError) as error:
      raise ValueError(f'Corrupt iterator bytes: the {fields["sampler"]!r} sampler settings or '
                       f'state are invalid: {error}') from error
    # The other fields are as `to_bytes` wrote them (the checksum holds).
    shared = _Shared(client_ids, fields['sampler'], fields['num_rounds'],
                     fields['participation_log'], json.dumps(fields['plan'], sort_keys=True))
    restored = SampledClientDataSourceIterator._of(shared, sampler, fields['log_offset'])
    return restored if cls._source is None else cls._source.resume(restored)

  def __deepcopy__(self, memo) -> 'SampledClientDataSourceIterator':
    # train_model deep-copies the iterator twice a round: copy only the sampler state.
    return self._of(self._shared, self._sampler.copy(), self._offset)

  def _key(self) -> tuple:
    state = self._sampler.state
    return (self._shared, json.dumps(self._sampler.config(), sort_keys=True), self._offset,
            tuple((name, state[name].tobytes()) for name in sorted(state)))

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, SampledClientDataSourceIterator):
      return NotImplemented
    return self is other or self._key() == other._key()

  __hash__ = None  # mutable


class SampledClientDataSource(_Selection, tff.program.FederatedDataSource):
  """Client ids drawn by the plan's sampler and logged (module docstring). With `train_model`,
  compose the learning process with a dataset computation so it takes client ids
  (`programs.client_ids.process_over_client_ids`), and pass `train_per_round_clients` = the plan's
  `clients_per_round` for fixed cohorts (min-sep)."""

  def __init__(self, population, plan: plan_lib.RunPlan, participation_log: str, seed: int):
    """Creates the log with its header if missing (never truncates it).

    Args:
      population: unique client ids (str) or a `tff.simulation.datasets.ClientData`, in the order
        the draws are made over (the drivers' order gives their cohorts).
      plan: a trainable `RunPlan`: its sampler (`sampling.make_sampler`) and `num_rounds`; the
        iterators it restores must have been drawn for it (module docstring).
      participation_log: path of the `client_id,round` CSV log (stored absolute).
      seed: the sampler seed (the drivers' `--seed`).

    Raises DataSourceTypeError for a `population` of another type, ValueError for what
    `make_sampler` refuses, a bad log path or a file there that is not a participation log.
    """
    self._build(population, plan, participation_log, seed)
    # The class TFF's program state managers restore this source's iterators with
    # (`type(template).from_bytes`): it continues them with this source, checked (`resume`).
    self._iterator_class = type(SampledClientDataSourceIterator.__name__,
                                (SampledClientDataSourceIterator,),
                                {'_source': self, '__module__': __name__})

  def iterator(self) -> SampledClientDataSourceIterator:
    """A new iterator at round 0 and the log's first row, of the class that restores this source's
    iterators (module docstring). No side effects: `train_model` calls it on every start, and a
    restored iterator replaces it."""
    return self._iterator_class._of(self._shared, self._sampler.copy(), _FIRST_OFFSET)

  def resume(self, iterator: SampledClientDataSourceIterator) -> SampledClientDataSourceIterator:
    """A new iterator of this data source at `iterator`'s round and log offset: `iterator`'s draws
    (its sampler state) continue under this data source's rounds and log path, as a resumed run
    continues with a larger `num_rounds` or in a moved run directory. No side effects.

    Raises:
      ValueError: `iterator` is not a `SampledClientDataSourceIterator`, or its draws were made for
        another population (the same ids in the same order), sampler, seed or plan than this data
        source's (but for `plan.RESUMABLE_FIELDS`): one line naming what changed.
    """
    if not isinstance(iterator, SampledClientDataSourceIterator):
      raise ValueError('`iterator` must be a SampledClientDataSourceIterator, got '
                       f'{type(iterator).__name__}.')
    changes = []
    if iterator.client_ids != self.client_ids:
      changes.append(f'the population ({len(iterator.client_ids)} clients -> '
                     f'{len(self.client_ids)}' + (', reordered)' if sorted(iterator.client_ids)
                                                  == sorted(self.client_ids) else ')'))
    seeds = (iterator._sampler.config().get('seed'), self._sampler.config().get('seed'))
    if seeds[0] != seeds[1]:
      changes.append(f'seed: {seeds[0]} -> {seeds[1]}')
    changes += plan_lib.resume_changes(json.loads(iterator._shared.plan),
                                       json.loads(self._shared.plan))
    if changes:
      raise ValueError(
          f'`plan`: the checkpoint\'s data iterator (round {iterator.next_round}) was drawn for '
          f'another run than this data source\'s ({"; ".join(changes)}): a run resumed under '
          'other settings would state a guarantee its trained rounds do not have. Resume with the '
          'settings it trained with, or start a new run elsewhere.')
    sampler = self._sampler.copy()
    sampler.load_state(iterator._sampler.state)
    return self._iterator_class._of(self._shared, sampler, iterator.log_offset)


def _plan_binding(plan: plan_lib.RunPlan) -> str:
  """The plan the draws are made for, as an iterator's bytes hold it: `to_config` with the
  strategy's arrays as fingerprints, as sorted JSON."""
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {type(plan).__name__}.')
  return json.dumps(plan.to_config(fingerprint_arrays=True), sort_keys=True)


def _unpack(buffer) -> dict:
  """The fields of iterator bytes; ValueError naming what is wrong."""
  buffer = bytes(buffer) if isinstance(buffer, (bytearray, memoryview)) else buffer
  if not isinstance(buffer, bytes):
    raise ValueError(f'`buffer` must be bytes, got {type(buffer).__name__}.')
  if len(buffer) < _PREFIX.size:
    raise ValueError(f'Truncated iterator bytes: {len(buffer)} bytes, fewer than the prefix.')
  magic, version, digest = _PREFIX.unpack_from(buffer)
  body = buffer[_PREFIX.size:]
  if magic != _MAGIC:
    raise ValueError(f'Not iterator bytes: magic {magic!r}.')
  if version != FORMAT_VERSION:
    earlier = (' (written by an earlier release, without the plan its draws were made for: they '
               'cannot be checked against a run\'s plan; start a new run)'
               if version < FORMAT_VERSION else '')
    raise ValueError(f'Unsupported iterator bytes format version {version}{earlier} (this version '
                     f'reads {FORMAT_VERSION}).')
  if hashlib.sha256(body).digest() != digest:
    raise ValueError('Corrupt iterator bytes: they fail their SHA-256 checksum (truncated or '
                     'altered).')
  try:
    fields = json.loads(body.decode('utf-8'))
  except (UnicodeDecodeError, ValueError) as error:
    raise ValueError(f'Corrupt iterator bytes: not UTF-8 JSON ({error}).') from error
  missing = sorted(set(_FIELDS) - set(fields)) if isinstance(fields, dict) else list(_FIELDS)
  if missing:
    raise ValueError(f'Corrupt iterator bytes: the fields lack {missing}.')
  return fields
