"""A `tff.program.FederatedDataSource` whose rounds are drawn by the plan's client sampler.

`SampledClientDataSource` wraps a client-id population (a sequence of ids or a
`tff.simulation.datasets.ClientData`) and selects each round's cohort with the sampler of the plan
(`sampling.make_sampler`, as the drivers do). `select` returns client ids, as
`tff.program.ClientIdDataSource` does, and appends the cohort to the participation log
(`accounting.participation_log`), so `tff.learning.programs.train_model` can train on it and the
privacy report can read the log.

Conventions: rounds are 0-based (t = 0 .. n-1): `train_model`'s round j (1-based) selects round
t = j - 1.

Restart contract. The iterator's bytes (`to_bytes`) hold everything needed to rebuild it (TFF
restores iterators with `type(template).from_bytes(bytes)` and nothing else): the population, the
sampler's kind, settings (`Sampler.config`) and state (`Sampler.state`, the dict the drivers'
checkpoint stores), the log's path and the byte offset where the next round's rows start. Draws are
a pure function of (seed, population order, round, state), and `select` first cuts the log back to
the offset and then appends (`ParticipationLogWriter.append_round_at`). So a program restored from
any saved state, whatever was written after it (selected rounds that were not saved, a torn last
line), selects and logs exactly what an uninterrupted program does; a round `train_model` discards
is re-selected from its deep copy with the same cohort and log bytes. Under the same population
order, seed and plan, the log is byte-identical to the drivers'. Neither the data source's
constructor nor `iterator()` truncates the log: a fresh start over a log with rows replaces them at
its first `select`, so a program must refuse to start fresh over an old run's log.

Bytes format (version 2; integers little-endian):
  b'DPFTRLIT' | u16 version | u64 length L | L bytes of UTF-8 JSON header | payload
  header: sampler (the kind), config, num_rounds, participation_log (absolute path), log_offset,
    payload_sha256;
  payload: ASCII JSON {"client_ids": [...], "state": {name: integer or nested list}}.
"""

import hashlib
import json
import numbers
import os
import struct
from collections.abc import Sequence
from typing import List, Optional, Tuple

import numpy as np
import tensorflow_federated as tff

from dp_ftrl_tff import _validation, sampling
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as participation_log_lib

_MAGIC = b'DPFTRLIT'
FORMAT_VERSION = 2
_PREFIX = struct.Struct('<8sHQ')  # magic, version, header length
_HEADER_KEYS = ('sampler', 'config', 'num_rounds', 'participation_log', 'log_offset',
                'payload_sha256')
# Byte offset of round 0's rows: just past the header line.
_FIRST_OFFSET = len(participation_log_lib.HEADER_BYTES)


class DataSourceTypeError(TypeError, ValueError):
  """An argument of the wrong type: a TypeError, as TFF's data sources raise for one, and a
  ValueError, as every dp_ftrl_tff entry point raises for a bad argument."""


def _population_ids(population) -> Tuple[str, ...]:
  """The client ids of `population`, in its order (the sampler checks they are unique)."""
  if isinstance(population, tff.simulation.datasets.ClientData):
    population = population.client_ids
  if not isinstance(population, Sequence) or isinstance(population, str):
    raise DataSourceTypeError('`population` must be a sequence of client ids (str) or a '
                              f'tff.simulation.datasets.ClientData, got {type(population).__name__}.')
  ids = tuple(population)
  for client_id in ids:
    if not isinstance(client_id, str):
      raise DataSourceTypeError(f'`population`: client ids must be str, got {client_id!r}.')
  return ids


class _Selection:
  """What the data source and its iterator share (immutable): the population, the sampler's kind
  and rounds, the log path; `_sampler` is the data source's at round 0, the iterator's current."""

  def _set(self, client_ids, kind, num_rounds, path, sampler) -> None:
    self._client_ids, self._kind, self._num_rounds = client_ids, kind, num_rounds
    self._path, self._sampler = path, sampler

  def _build(self, population, plan: plan_lib.RunPlan, participation_log, seed) -> None:
    if not isinstance(plan, plan_lib.RunPlan):
      raise ValueError(f'`plan` must be a RunPlan, got {type(plan).__name__}.')
    if not isinstance(participation_log, (str, os.PathLike)) or not os.fspath(participation_log):
      raise ValueError(f'`participation_log` must be a non-empty path, got {participation_log!r}.')
    client_ids = _population_ids(population)
    path = os.path.abspath(os.fspath(participation_log))
    self._set(client_ids, plan.sampling.kind, plan.num_rounds, path,
              sampling.make_sampler(client_ids, plan, seed))
    participation_log_lib.ParticipationLogWriter(path)  # creates the log or checks its header

  @property
  def federated_type(self) -> tff.FederatedType:
    """`{str}@CLIENTS`, as `tff.program.ClientIdDataSource`: one client id per client."""
    return tff.FederatedType(np.str_, tff.CLIENTS)

  @property
  def client_ids(self) -> Tuple[str, ...]:
    """The population, in the order the draws are made over."""
    return self._client_ids

  @property
  def participation_log(self) -> str:
    """The absolute path of the participation log."""
    return self._path


class SampledClientDataSourceIterator(_Selection, tff.program.FederatedDataSourceIterator):
  """Selects round after round of client ids with the plan's sampler and logs them; see the module
  docstring for the restart contract and the bytes.

  Usually made by `SampledClientDataSource.iterator()` or restored by `from_bytes`; the constructor
  (the data source's arguments) starts at round 0 and creates the log with its header if missing.
  """

  def __init__(self, population, plan: plan_lib.RunPlan, participation_log: str, seed: int):
    self._build(population, plan, participation_log, seed)
    self._offset = _FIRST_OFFSET

  @classmethod
  def _of(cls, parts: tuple, offset: int) -> 'SampledClientDataSourceIterator':
    """An iterator of (client_ids, kind, num_rounds, path, sampler) at the log's `offset`."""
    iterator = cls.__new__(cls)
    iterator._set(*parts)
    iterator._offset = offset
    return iterator

  @property
  def sampler_kind(self) -> str:
    """The plan's `Sampling.kind`."""
    return self._kind

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

    Args:
      k: the cohort size `train_model` asks for (its `train_per_round_clients`): an int in
        [0, population]; a sampler of fixed cohorts (min-sep) needs exactly its size. Random
        cohorts are random (possibly empty): k is only checked against the population.

    Raises:
      DataSourceTypeError (a TypeError and a ValueError): `k` is not an int.
      ValueError: a bad `k`; every `num_rounds` round was selected; the log is missing or shorter
        than the offset (edited or replaced). The iterator is unchanged.
      RuntimeError: too few clients are eligible (min-sep with a cap; `ClientSampler.sample`).
    """
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
      raise DataSourceTypeError(f'`k` must be an int, got {k!r}.')
    population, size = len(self._client_ids), self._sampler.cohort_size
    if k is None or k < 0 or k > population:
      raise ValueError(f'`k` must be an integer in [0, {population}] (the population), got {k!r}.')
    if size is not None and k != size:
      raise ValueError(f'`k`={k}, but the {self._kind} sampler draws exactly {size} clients: give '
                       f'train_model train_per_round_clients={size}.')
    round_num = self.next_round
    if self._num_rounds is not None and round_num >= self._num_rounds:
      raise ValueError(f'All `num_rounds`={self._num_rounds} rounds were selected; the schedule '
                       'has no further round.')
    if not os.path.isfile(self._path):
      raise ValueError(f'The participation log {self._path} is missing (the iterator is at round '
                       f'{round_num}, byte {self._offset}).')
    # Draw on a copy; commit only once the log write succeeded.
    sampler = self._sampler.copy()
    cohort = sampler.sample(round_num)
    writer = participation_log_lib.ParticipationLogWriter(self._path)
    self._offset = writer.append_round_at(self._offset, round_num, cohort)
    self._sampler = sampler
    return cohort

  def to_bytes(self) -> bytes:
    """The iterator as self-contained bytes (format in the module docstring)."""
    payload = json.dumps({'client_ids': list(self._client_ids),
                          'state': {k: v.tolist() for k, v in self._sampler.state.items()}},
                         ensure_ascii=True).encode('ascii')
    header = json.dumps({
        'sampler': self._kind, 'config': self._sampler.config(), 'num_rounds': self._num_rounds,
        'participation_log': self._path, 'log_offset': self._offset,
        'payload_sha256': hashlib.sha256(payload).hexdigest()}, sort_keys=True).encode('utf-8')
    return _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header)) + header + payload

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'SampledClientDataSourceIterator':
    """Rebuilds an iterator from `to_bytes` output; touches no file (the log is read at `select`).

    Raises:
      ValueError: `buffer` is not bytes, or is truncated, of another format or version, fails its
        checksum, or holds invalid settings or state (the message names what is wrong).
    """
    header, payload = _unpack(buffer)
    try:
      client_ids = tuple(_population_ids(payload['client_ids']))
      sampler = sampling.sampler_class(header['sampler']).from_config(client_ids, header['config'])
      sampler.load_state({k: np.asarray(v, dtype=np.int64) for k, v in payload['state'].items()})
      path, offset = header['participation_log'], header['log_offset']
      if not isinstance(path, str) or not os.path.isabs(path):
        raise ValueError(f'`participation_log` must be an absolute path, got {path!r}.')
      if _validation.check_nonnegative_int(offset, 'log_offset') < _FIRST_OFFSET:
        raise ValueError(f'`log_offset`={offset} lies inside the log header.')
      num_rounds = header['num_rounds']
      if num_rounds is not None:
        _validation.check_positive_int(num_rounds, 'num_rounds')
    except (TypeError, ValueError, AttributeError) as error:
      raise ValueError(f'Corrupt iterator bytes: the {header["sampler"]!r} sampler settings or '
                       f'state are invalid: {error}') from error
    return cls._of((client_ids, header['sampler'], num_rounds, path, sampler), offset)

  def __deepcopy__(self, memo) -> 'SampledClientDataSourceIterator':
    # train_model deep-copies the iterator twice a round: share the immutable parts and copy only
    # the sampler state.
    return self._of((self._client_ids, self._kind, self._num_rounds, self._path,
                     self._sampler.copy()), self._offset)

  def _key(self) -> tuple:
    state = self._sampler.state
    return (self._client_ids, self._kind, self._num_rounds, self._path, self._offset,
            json.dumps(self._sampler.config(), sort_keys=True),
            tuple((name, state[name].tobytes()) for name in sorted(state)))

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, SampledClientDataSourceIterator):
      return NotImplemented
    return self is other or self._key() == other._key()

  __hash__ = None  # mutable

  def __repr__(self) -> str:
    return (f'SampledClientDataSourceIterator(sampler={self._kind!r}, population='
            f'{len(self._client_ids)}, next_round={self.next_round}, log_offset={self._offset}, '
            f'participation_log={self._path!r})')


class SampledClientDataSource(_Selection, tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` of client ids drawn by the plan's sampler and logged to a
  participation log (module docstring). With `tff.learning.programs.train_model`, compose the
  learning process with a dataset computation
  (`tff.simulation.compose_dataset_computation_with_learning_process`) so it takes client ids, and
  pass `train_per_round_clients` = the plan's `clients_per_round` for fixed cohorts (min-sep)."""

  def __init__(self, population, plan: plan_lib.RunPlan, participation_log: str, seed: int):
    """Builds the data source; creates the log with its header if missing (never truncates it).

    Args:
      population: the client ids: a sequence of unique str or a
        `tff.simulation.datasets.ClientData` (its `client_ids`). Draws are made over this order:
        the drivers' order (the ClientData's `client_ids`) gives the drivers' cohorts.
      plan: a trainable `RunPlan`; its `sampling` (with its `clients_per_round`, `participation`,
        `num_rounds` and `population`) makes the sampler (`sampling.make_sampler`); `select`
        refuses a round past its `num_rounds`.
      participation_log: path of the `client_id,round` CSV log (made absolute: the iterator's bytes
        hold it).
      seed: the sampler seed (the drivers' `--seed`), a non-negative int.

    Raises:
      DataSourceTypeError (a TypeError and a ValueError): `population` is not a sequence of str or
        a ClientData.
      ValueError: a population the sampler refuses (empty, repeated ids, another size than the
        plan's), a plan it cannot sample (e.g. an impossible schedule), a bad seed or log path, or
        an existing `participation_log` that is not a participation log.
    """
    self._build(population, plan, participation_log, seed)

  def iterator(self) -> SampledClientDataSourceIterator:
    """A new iterator at round 0 and the log's first row. No side effects: `train_model` calls it
    on every start, and a restored iterator replaces it."""
    return SampledClientDataSourceIterator._of(
        (self._client_ids, self._kind, self._num_rounds, self._path, self._sampler.copy()),
        _FIRST_OFFSET)


def _unpack(buffer) -> Tuple[dict, dict]:
  """(header, payload) of iterator bytes; ValueError naming what is wrong."""
  if isinstance(buffer, (bytearray, memoryview)):
    buffer = bytes(buffer)
  if not isinstance(buffer, bytes):
    raise ValueError(f'`buffer` must be bytes, got {type(buffer).__name__}.')
  what = 'SampledClientDataSourceIterator bytes'
  if len(buffer) < _PREFIX.size:
    raise ValueError(f'Truncated {what}: {len(buffer)} bytes, fewer than the {_PREFIX.size}-byte '
                     'prefix.')
  magic, version, header_size = _PREFIX.unpack_from(buffer)
  if magic != _MAGIC:
    raise ValueError(f'Not {what}: magic {magic!r}, expected {_MAGIC!r}.')
  if version != FORMAT_VERSION:
    raise ValueError(f'Unsupported {what} format version {version}; this version reads '
                     f'{FORMAT_VERSION}.')
  end = _PREFIX.size + header_size
  if end > len(buffer):
    raise ValueError(f'Truncated {what}: the header needs {header_size} bytes, '
                     f'{len(buffer) - _PREFIX.size} follow the prefix.')
  header = _json_object(buffer[_PREFIX.size:end], f'{what}: the header')
  missing = [key for key in _HEADER_KEYS if key not in header]
  if missing:
    raise ValueError(f'Corrupt {what}: the header lacks {missing}.')
  if hashlib.sha256(buffer[end:]).hexdigest() != header['payload_sha256']:
    raise ValueError(f'Corrupt {what}: the client ids or sampler state fail their SHA-256 checksum.')
  payload = _json_object(buffer[end:], f'{what}: the payload')
  if set(payload) != {'client_ids', 'state'} or not isinstance(payload['state'], dict):
    raise ValueError(f'Corrupt {what}: the payload must hold `client_ids` and a `state` object.')
  return header, payload


def _json_object(blob: bytes, what: str) -> dict:
  try:
    value = json.loads(blob.decode('utf-8'))
  except (UnicodeDecodeError, ValueError) as error:
    raise ValueError(f'Corrupt {what} is not UTF-8 JSON ({error}).') from error
  if not isinstance(value, dict):
    raise ValueError(f'Corrupt {what} is not a JSON object.')
  return value
