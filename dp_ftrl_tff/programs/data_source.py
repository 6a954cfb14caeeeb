"""A `tff.program.FederatedDataSource` whose rounds are drawn by the project's client samplers.

`SampledClientDataSource` wraps a client-id population (a sequence of ids, a
`tff.simulation.datasets.ClientData` or a `tff.program.ClientIdDataSource`) and selects each round's
cohort with the drivers' samplers: min-sep (`learning.client_sampler.ClientSampler`, exactly
`clients_per_round` clients, b-min-sep with at most k participations) or Poisson / cyclic Poisson
(`learning.poisson_sampler.PoissonSampler`, a random cohort). `select` returns client ids, as
`tff.program.ClientIdDataSource` does, and appends the cohort to the participation log
(`accounting.participation_log`), so `tff.learning.programs.train_model` can train on it and the
privacy report can read the log.

Conventions: rounds are 0-based (t = 0 .. n-1): `train_model`'s round j (1-based) selects round
t = j - 1. `min_sep` = b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1).

Restart contract. The iterator's bytes (`to_bytes`) hold everything needed to rebuild it (TFF
restores iterators with `type(template).from_bytes(bytes)` and nothing else): the population, the
sampler settings and state, the log's path and the byte offset where the next round's rows start.
Draws are a pure function of (seed, population order, round, history), and `select` first cuts the
log back to the offset and then appends (`ParticipationLogWriter.append_round_at`). So a program
restored from any saved state, whatever was written after that state (selected rounds that were not
saved, a torn last line), selects and logs exactly what an uninterrupted program does; a round
`train_model` discards is re-selected from its deep copy with the same cohort and log bytes. Under
the same population order, seed and settings, the log is byte-identical to the drivers' (their
`ParticipationLogWriter.append_round` with the same sampler). Neither the data source's constructor
nor `iterator()` truncates the log: a fresh start (no saved state) over a log with rows replaces them
at its first `select`, so a program must refuse to start fresh over an old run's log.

Bytes format (version 1; integers little-endian):
  b'DPFTRLIT' | u16 version | u64 length L | L bytes of UTF-8 JSON header | payload
  header: sampler, seed, clients_per_round, min_sep, max_participations, num_rounds, sampling
    (`Sampling.to_config()` or null), participation_log (absolute path), log_offset, next_round,
    population, ids_bytes, payload_sha256;
  payload: the client ids as an ASCII JSON array (`ids_bytes` bytes), then for min-sep the sampler's
    `last_round` and `num_participations` (int64 each, one per client, population order).
"""

import copy
import dataclasses
import hashlib
import json
import numbers
import os
import struct
from collections.abc import Sequence
from typing import List, Optional, Tuple, Union

import numpy as np
import tensorflow_federated as tff

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as participation_log_lib
from dp_ftrl_tff.learning import client_sampler, poisson_sampler
from dp_ftrl_tff.mechanisms import participation as participation_lib

#: The sampler kinds: min-sep (exactly `clients_per_round` clients) or a `plan.Sampling` kind.
SAMPLER_KINDS = ('min_sep',) + plan_lib.SAMPLING_KINDS

_MAGIC = b'DPFTRLIT'
FORMAT_VERSION = 1
_PREFIX = struct.Struct('<8sHQ')  # magic, version, header length
_HEADER_KEYS = ('sampler', 'seed', 'clients_per_round', 'min_sep', 'max_participations',
                'num_rounds', 'sampling', 'participation_log', 'log_offset', 'next_round',
                'population', 'ids_bytes', 'payload_sha256')
# Byte offset of round 0's rows: just past the header line.
_FIRST_OFFSET = len(participation_log_lib.HEADER_BYTES)

Sampler = Union[client_sampler.ClientSampler, poisson_sampler.PoissonSampler]


class DataSourceTypeError(TypeError, ValueError):
  """An argument of the wrong type: a TypeError, as TFF's data sources raise for one, and a
  ValueError, as every dp_ftrl_tff entry point raises for a bad argument."""


@dataclasses.dataclass(frozen=True)
class _Settings:
  """The sampler settings and the log path: immutable, shared by an iterator and its copies."""
  participation_log: str  # absolute
  seed: int
  clients_per_round: Optional[int]  # min-sep only
  min_sep: int
  max_participations: Optional[int]
  num_rounds: Optional[int]
  sampling: Optional[plan_lib.Sampling]

  @property
  def sampler(self) -> str:
    return 'min_sep' if self.sampling is None else self.sampling.kind


def _make_settings(participation_log, seed, clients_per_round, min_sep, max_participations,
                   num_rounds, sampling) -> _Settings:
  """Validates the constructor arguments (not the population; `_build_sampler` checks both)."""
  if not isinstance(participation_log, (str, os.PathLike)) or not os.fspath(participation_log):
    raise ValueError(f'`participation_log` must be a non-empty path, got {participation_log!r}.')
  path = os.path.abspath(os.fspath(participation_log))
  seed = _validation.check_nonnegative_int(seed, 'seed')
  if num_rounds is not None:
    num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if sampling is None:
    if clients_per_round is None:
      raise ValueError('`clients_per_round` is required for min-sep sampling (no `sampling`).')
    clients_per_round = _validation.check_positive_int(clients_per_round, 'clients_per_round')
    min_sep = _validation.check_positive_int(min_sep, 'min_sep')
    if max_participations is not None:
      max_participations = _validation.check_positive_int(max_participations,
                                                          'max_participations')
  else:
    if not isinstance(sampling, plan_lib.Sampling):
      raise ValueError(f'`sampling` must be a plan.Sampling or None, got {sampling!r}.')
    # The cohort and the separation come from the sampling (q, b-hat); a second source would
    # contradict it.
    for name, value, default in (('clients_per_round', clients_per_round, None),
                                 ('min_sep', min_sep, 1),
                                 ('max_participations', max_participations, None)):
      if value != default:
        raise ValueError(f'`{name}` must be left at {default!r} with `sampling` (the '
                         f'{sampling.kind} cohorts come from it), got {value!r}.')
    if sampling.population is None:
      raise ValueError('`sampling.population` must be set (a plan made for accounting only has '
                       'none).')
  return _Settings(path, seed, clients_per_round, min_sep, max_participations, num_rounds,
                   sampling)


def _population_ids(population) -> Tuple[str, ...]:
  """The client ids of `population`, in its order (the order the draws are made over)."""
  if isinstance(population, tff.program.ClientIdDataSource):
    # TFF keeps the ids private and has no accessor; read them here only, and fail clearly if a
    # TFF version stores them otherwise.
    ids = getattr(population, '_client_ids', None)
    if not isinstance(ids, Sequence) or isinstance(ids, str):
      raise DataSourceTypeError(
          '`population`: cannot read the client ids of this tff.program.ClientIdDataSource (TFF '
          'changed its internals); pass its id list instead.')
  elif isinstance(population, tff.simulation.datasets.ClientData):
    ids = population.client_ids
  elif isinstance(population, Sequence) and not isinstance(population, (str, bytes)):
    ids = population
  else:
    raise DataSourceTypeError(
        '`population` must be a sequence of client ids (str), a tff.simulation.datasets.ClientData '
        f'or a tff.program.ClientIdDataSource, got {type(population).__name__}.')
  ids = tuple(ids)
  for client_id in ids:
    if not isinstance(client_id, str):
      raise DataSourceTypeError(f'`population`: client ids must be str, got {client_id!r}.')
  if not ids:
    raise ValueError('`population` must not be empty.')
  if len(set(ids)) != len(ids):
    seen = set()
    duplicate = next(c for c in ids if c in seen or seen.add(c))
    raise ValueError(f'`population` must hold unique client ids; {duplicate!r} repeats.')
  return ids


def _build_sampler(client_ids: Tuple[str, ...], settings: _Settings) -> Sampler:
  """A sampler at round 0; raises ValueError on an impossible schedule or a population that does not
  match `sampling.population`."""
  if settings.sampling is None:
    return client_sampler.ClientSampler(
        client_ids, settings.clients_per_round, min_sep=settings.min_sep,
        max_participations=settings.max_participations, seed=settings.seed,
        num_rounds=settings.num_rounds)
  if settings.sampling.population != len(client_ids):
    raise ValueError(f'`population` holds {len(client_ids)} clients, but `sampling.population`='
                     f'{settings.sampling.population}.')
  return poisson_sampler.PoissonSampler(client_ids, settings.sampling, seed=settings.seed)


def _copy_sampler(sampler: Sampler) -> Sampler:
  """An independent sampler at the same state. The samplers never mutate their ids, settings or
  (Poisson) groups, so the shallow copy shares those and only the state is copied."""
  copied = copy.copy(sampler)
  copied.load_state(sampler.state)
  return copied


def _state_key(sampler: Sampler) -> tuple:
  state = sampler.state
  if isinstance(state, client_sampler.SamplerState):
    return (state.next_round, state.last_round.tobytes(), state.num_participations.tobytes())
  return (state.next_round, state.population)


def _ensure_log(path: str) -> None:
  """Creates the log with its header if missing; checks the header of an existing one."""
  participation_log_lib.ParticipationLogWriter(path)


class _ClientIdSelection:
  """What the data source and its iterator share: the population (`_client_ids`) and the type of a
  selection."""

  _client_ids: Tuple[str, ...]

  @property
  def federated_type(self) -> tff.FederatedType:
    """`{str}@CLIENTS`, as `tff.program.ClientIdDataSource`: one client id per client."""
    return tff.FederatedType(np.str_, tff.CLIENTS)

  @property
  def client_ids(self) -> Tuple[str, ...]:
    """The population, in the order the draws are made over."""
    return self._client_ids


class SampledClientDataSourceIterator(_ClientIdSelection,
                                      tff.program.FederatedDataSourceIterator):
  """Selects round after round of client ids with a min-sep or (cyclic) Poisson sampler and logs
  them; see the module docstring for the restart contract and the bytes.

  Usually made by `SampledClientDataSource.iterator()` or restored by `from_bytes`; the constructor
  (the data source's arguments) starts at round 0.
  """

  def __init__(self, population, *, participation_log: str, seed: int,
               clients_per_round: Optional[int] = None, min_sep: int = 1,
               max_participations: Optional[int] = None, num_rounds: Optional[int] = None,
               sampling: Optional[plan_lib.Sampling] = None):
    """Builds an iterator at round 0 (creates the log with its header if missing, never truncates).

    Args: as `SampledClientDataSource`.
    """
    client_ids = _population_ids(population)
    settings = _make_settings(participation_log, seed, clients_per_round, min_sep,
                              max_participations, num_rounds, sampling)
    sampler = _build_sampler(client_ids, settings)
    _ensure_log(settings.participation_log)
    self._set(client_ids, settings, sampler, _FIRST_OFFSET)

  def _set(self, client_ids, settings, sampler, log_offset) -> None:
    self._client_ids = client_ids
    self._settings = settings
    self._sampler = sampler
    self._log_offset = log_offset

  @classmethod
  def _from_parts(cls, client_ids, settings, sampler, log_offset) -> 'SampledClientDataSourceIterator':
    """An iterator from validated parts, without touching the log (restores and copies)."""
    iterator = cls.__new__(cls)
    iterator._set(client_ids, settings, sampler, log_offset)
    return iterator

  @property
  def sampler_kind(self) -> str:
    """'min_sep', 'poisson' or 'cyclic_poisson'."""
    return self._settings.sampler

  @property
  def next_round(self) -> int:
    """The 0-based round the next `select` draws (= the rounds selected so far)."""
    return self._sampler.state.next_round

  @property
  def log_offset(self) -> int:
    """The byte offset of the log where the next round's rows start."""
    return self._log_offset

  @property
  def participation_log(self) -> str:
    """The absolute path of the participation log."""
    return self._settings.participation_log

  def select(self, k: Optional[int] = None) -> List[str]:
    """Draws the next round's cohort, writes it to the log at the held offset, and returns it.

    Args:
      k: the cohort size `train_model` asks for (its `train_per_round_clients`): an int in
        [0, population]. Min-sep sampling draws exactly `clients_per_round` clients, so k must equal
        it. (Poisson) cyclic Poisson cohorts are random (possibly empty): k is only checked against
        the population, and the mean divides by the plan's expected cohort size whatever it is.

    Returns:
      The client ids of round `next_round` (min-sep: in the order drawn; Poisson: population order).

    Raises:
      DataSourceTypeError (a TypeError and a ValueError): `k` is not an int.
      ValueError: `k` is None, negative, larger than the population or (min-sep) not
        `clients_per_round`; every `num_rounds` round was selected; the log is missing or shorter
        than the offset (edited or replaced). The iterator is unchanged.
      RuntimeError: too few clients are eligible (min-sep with a cap; see `ClientSampler.sample`).
    """
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
      raise DataSourceTypeError(f'`k` must be an int, got {k!r}.')
    population = len(self._client_ids)
    if k is None or k < 0 or k > population:
      raise ValueError(f'`k` must be an integer in [0, {population}] (the population), got '
                       f'{k!r}.')
    settings = self._settings
    if settings.sampling is None and k != settings.clients_per_round:
      raise ValueError(f'`k`={k}, but the min-sep sampler draws exactly `clients_per_round`='
                       f'{settings.clients_per_round} clients: give train_model '
                       f'train_per_round_clients={settings.clients_per_round}.')
    round_num = self.next_round
    if settings.num_rounds is not None and round_num >= settings.num_rounds:
      raise ValueError(f'All `num_rounds`={settings.num_rounds} rounds were selected; the schedule '
                       'has no further round.')
    if not os.path.isfile(settings.participation_log):
      raise ValueError(f'The participation log {settings.participation_log} is missing (the '
                       f'iterator is at round {round_num}, byte {self._log_offset}).')
    # Draw on a copy and commit only after the log write succeeded: a failed select leaves the
    # iterator where it was.
    sampler = _copy_sampler(self._sampler)
    cohort = sampler.sample(round_num)
    writer = participation_log_lib.ParticipationLogWriter(settings.participation_log)
    self._log_offset = writer.append_round_at(self._log_offset, round_num, cohort)
    self._sampler = sampler
    return cohort

  def to_bytes(self) -> bytes:
    """The iterator as self-contained bytes (format in the module docstring)."""
    return _pack(self._client_ids, self._settings, self._sampler.state, self._log_offset)

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'SampledClientDataSourceIterator':
    """Rebuilds an iterator from `to_bytes` output; touches no file (the log is read at `select`).

    Raises:
      ValueError: `buffer` is not bytes, or is truncated, of another format or version, fails its
        checksum, or holds invalid settings or state (the message names what is wrong).
    """
    client_ids, settings, state, log_offset = _unpack(buffer)
    try:
      sampler = _build_sampler(client_ids, settings)
      sampler.load_state(state)
    except ValueError as error:
      raise ValueError(f'The iterator bytes hold an invalid sampler setting or state: {error}'
                       ) from error
    return cls._from_parts(client_ids, settings, sampler, log_offset)

  def __deepcopy__(self, memo) -> 'SampledClientDataSourceIterator':
    # train_model deep-copies the iterator twice a round: share the immutable ids and settings and
    # copy only the sampler state.
    return type(self)._from_parts(self._client_ids, self._settings, _copy_sampler(self._sampler),
                                  self._log_offset)

  def __eq__(self, other: object) -> bool:
    if self is other:
      return True
    if not isinstance(other, SampledClientDataSourceIterator):
      return NotImplemented
    return (self._settings == other._settings and self._log_offset == other._log_offset
            and self._client_ids == other._client_ids
            and _state_key(self._sampler) == _state_key(other._sampler))

  __hash__ = None  # mutable

  def __repr__(self) -> str:
    return (f'SampledClientDataSourceIterator(sampler={self.sampler_kind!r}, population='
            f'{len(self._client_ids)}, next_round={self.next_round}, log_offset='
            f'{self._log_offset}, participation_log={self.participation_log!r})')


class SampledClientDataSource(_ClientIdSelection, tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` of client ids, drawn by min-sep or (cyclic) Poisson
  sampling and logged to a participation log (module docstring).

  With `tff.learning.programs.train_model`, compose the learning process with a dataset computation
  (`tff.simulation.compose_dataset_computation_with_learning_process`) so it takes client ids, and
  pass `train_per_round_clients` = `clients_per_round` for min-sep sampling.
  """

  def __init__(self, population, *, participation_log: str, seed: int,
               clients_per_round: Optional[int] = None, min_sep: int = 1,
               max_participations: Optional[int] = None, num_rounds: Optional[int] = None,
               sampling: Optional[plan_lib.Sampling] = None):
    """Builds the data source; creates the log with its header if missing (never truncates it).

    Args:
      population: the client ids: a sequence of unique str, a `tff.simulation.datasets.ClientData`
        (its `client_ids`) or a `tff.program.ClientIdDataSource` (its ids, read from TFF's private
        attribute). Non-empty. Draws are made over this order: the drivers' order (the
        ClientData's `client_ids`) gives the drivers' cohorts.
      participation_log: path of the `client_id,round` CSV log (made absolute: the iterator's bytes
        hold it).
      seed: non-negative int; the cohorts are a function of (seed, population order, round).
      clients_per_round: min-sep sampling (no `sampling`): m >= 1 clients drawn in every round.
      min_sep: min-sep sampling: b >= 1; a client of round r is eligible again from round r + b.
      max_participations: min-sep sampling: k >= 1, or None for no cap.
      num_rounds: n, the rounds the program trains, or None. Given, min-sep schedules are checked
        (`client_sampler.check_schedule`) and `select` refuses a round past n - 1.
      sampling: a `plan.Sampling` ('poisson' or 'cyclic_poisson', with `population` equal to the
        population's size) for random cohorts; then `clients_per_round`, `min_sep` and
        `max_participations` stay at their defaults.

    Raises:
      DataSourceTypeError (a TypeError and a ValueError): `population` is not a sequence of str,
        a ClientData or a ClientIdDataSource.
      ValueError: an empty population or repeated ids, a bad setting, an impossible schedule, or an
        existing `participation_log` that is not a participation log.
    """
    self._client_ids = _population_ids(population)
    self._settings = _make_settings(participation_log, seed, clients_per_round, min_sep,
                                    max_participations, num_rounds, sampling)
    _build_sampler(self._client_ids, self._settings)  # checks the schedule and the population
    _ensure_log(self._settings.participation_log)

  @classmethod
  def from_plan(cls, population, plan: plan_lib.RunPlan, participation_log: str,
                seed: int) -> 'SampledClientDataSource':
    """The data source of a run plan: its `sampling`, or min-sep sampling of `clients_per_round`
    clients under its declared participation (min_sep, max_participations), over `num_rounds`.

    Args:
      population: as the constructor; its size must be the plan's `population` when recorded.
      plan: a trainable `RunPlan` (not one made for accounting only).
      participation_log: as the constructor.
      seed: the sampler seed (the drivers' `--seed`).

    Raises:
      ValueError: as the constructor; a plan without `clients_per_round`, with a fractional one
        under min-sep sampling, with a fixed-epoch participation schema, or with another population.
    """
    if not isinstance(plan, plan_lib.RunPlan):
      raise ValueError(f'`plan` must be a RunPlan, got {type(plan).__name__}.')
    client_ids = _population_ids(population)
    if plan.population is not None and plan.population != len(client_ids):
      raise ValueError(f'`population` holds {len(client_ids)} clients, but the plan was made for '
                       f'{plan.population}.')
    if plan.sampling is not None:
      return cls(client_ids, participation_log=participation_log, seed=seed,
                 num_rounds=plan.num_rounds, sampling=plan.sampling)
    if plan.clients_per_round is None:
      raise ValueError('`plan` was made for accounting only: it has no `clients_per_round`.')
    if float(plan.clients_per_round) != int(plan.clients_per_round):
      raise ValueError(f'`plan.clients_per_round`={plan.clients_per_round} is fractional; min-sep '
                       'sampling draws whole cohorts.')
    schema = plan.participation or participation_lib.ParticipationSchema()
    if schema.fixed_epoch:
      raise ValueError('`plan.participation` is a fixed-epoch schema; the min-sep sampler enforces '
                       'b-min-sep participation only.')
    return cls(client_ids, participation_log=participation_log, seed=seed,
               clients_per_round=int(plan.clients_per_round), min_sep=schema.min_sep,
               max_participations=schema.max_participations, num_rounds=plan.num_rounds)

  @property
  def participation_log(self) -> str:
    """The absolute path of the participation log."""
    return self._settings.participation_log

  def iterator(self) -> SampledClientDataSourceIterator:
    """A new iterator at round 0 and the log's first row. No side effects: `train_model` calls it
    on every start, and a restored iterator replaces it."""
    sampler = _build_sampler(self._client_ids, self._settings)
    return SampledClientDataSourceIterator._from_parts(self._client_ids, self._settings, sampler,
                                                       _FIRST_OFFSET)


def _pack(client_ids, settings: _Settings, state, log_offset: int) -> bytes:
  ids_blob = json.dumps(list(client_ids), ensure_ascii=True).encode('ascii')
  if settings.sampling is None:
    arrays = (np.asarray(state.last_round, dtype='<i8').tobytes()
              + np.asarray(state.num_participations, dtype='<i8').tobytes())
  else:
    arrays = b''
  payload = ids_blob + arrays
  header = {
      'sampler': settings.sampler, 'seed': settings.seed,
      'clients_per_round': settings.clients_per_round, 'min_sep': settings.min_sep,
      'max_participations': settings.max_participations, 'num_rounds': settings.num_rounds,
      'sampling': None if settings.sampling is None else settings.sampling.to_config(),
      'participation_log': settings.participation_log, 'log_offset': log_offset,
      'next_round': state.next_round, 'population': len(client_ids), 'ids_bytes': len(ids_blob),
      'payload_sha256': hashlib.sha256(payload).hexdigest()}
  header_blob = json.dumps(header, sort_keys=True).encode('utf-8')
  return _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header_blob)) + header_blob + payload


def _unpack(buffer) -> tuple:
  """(client_ids, settings, sampler state, log_offset) of iterator bytes; ValueError naming what is
  wrong."""
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
  try:
    header = json.loads(buffer[_PREFIX.size:end].decode('utf-8'))
  except (UnicodeDecodeError, ValueError) as error:
    raise ValueError(f'Corrupt {what}: the header is not UTF-8 JSON ({error}).') from error
  if not isinstance(header, dict):
    raise ValueError(f'Corrupt {what}: the header is not a JSON object.')
  missing = [key for key in _HEADER_KEYS if key not in header]
  if missing:
    raise ValueError(f'Corrupt {what}: the header lacks {missing}.')
  payload = buffer[end:]
  if hashlib.sha256(payload).hexdigest() != header['payload_sha256']:
    raise ValueError(f'Corrupt {what}: the client ids or sampler state fail their SHA-256 checksum.')
  try:
    population = _validation.check_positive_int(header['population'], 'population')
    ids_bytes = _validation.check_nonnegative_int(header['ids_bytes'], 'ids_bytes')
    client_ids = json.loads(payload[:ids_bytes].decode('ascii'))
    if (not isinstance(client_ids, list) or len(client_ids) != population
        or not all(isinstance(c, str) for c in client_ids)):
      raise ValueError(f'`client_ids` must be a list of {population} str.')
    sampling = header['sampling']
    settings = _make_settings(
        header['participation_log'], header['seed'], header['clients_per_round'],
        header['min_sep'], header['max_participations'], header['num_rounds'],
        None if sampling is None else plan_lib.Sampling(**sampling))
    if header['sampler'] != settings.sampler:
      raise ValueError(f"`sampler`={header['sampler']!r} contradicts `sampling`.")
    next_round = _validation.check_nonnegative_int(header['next_round'], 'next_round')
    log_offset = _validation.check_nonnegative_int(header['log_offset'], 'log_offset')
    if log_offset < _FIRST_OFFSET:
      raise ValueError(f'`log_offset`={log_offset} lies inside the log header.')
    arrays = payload[ids_bytes:]
    if settings.sampling is None:
      if len(arrays) != 16 * population:
        raise ValueError(f'the min-sep state holds {len(arrays)} bytes, expected '
                         f'{16 * population}.')
      values = np.frombuffer(arrays, dtype='<i8').astype(np.int64)
      state = client_sampler.SamplerState(next_round=next_round, last_round=values[:population],
                                          num_participations=values[population:])
    else:
      if arrays:
        raise ValueError(f'{len(arrays)} unexpected bytes follow the client ids.')
      state = poisson_sampler.PoissonSamplerState(next_round=next_round, population=population)
  except (TypeError, ValueError) as error:  # JSON and Sampling field errors included
    raise ValueError(f'Corrupt {what}: {error}') from error
  return tuple(client_ids), settings, state, log_offset
