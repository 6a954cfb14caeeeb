"""The canary files of a run directory: written by the drivers, read by the report.

  * `canaries.json` (`CANARY_FILE`): {"format": 3, "seen": N, "unseen": N, "seed": int,
    "norm": "clip", "client_ids": [N distinct str], "dimension": d, "population": int or null,
    "plan_sha256": str, "run_id": str or null, "final_model_cosines": null or [2N floats in
    [-1, 1]]}. "norm": "clip" says the projections are divided by the round's clip norm.
    "population" (the plan's population, the canaries included) and "plan_sha256" (`plan_digest`
    of the run's plan) bind the file to its plan, "run_id" (the run's identity, random, drawn at its
    start; `RUN_ID_PATTERN`) to its run: the report refuses a canary file whose population or plan
    digest is not its plan's, or whose run identity is not that of the run it reports on (two runs
    of one plan with other seeds have equal plans, not equal identities).
  * `canaries.csv` (`PROJECTIONS_FILE`): header `round,p0,...,p{2N-1}`, then one row per 0-based
    round t holding P[:, t] (rows 0 .. N-1 of P are the seen canaries, N .. 2N-1 the unseen ones; see
    `statistics`). Floats are written with `repr`, which round-trips exactly, so a resumed run
    rewrites the same bytes.

`CanaryFilesWriter` appends one round at a time and flushes to disk (like the participation log), so
a killed run leaves rows complete up to its last finished round, at most with a torn last line that
the reader drops. Rows only grow, so a resumed driver run cuts the CSV back to the byte length its
checkpoint recorded (`dp_ftrl_tff/training/checkpoint_records.py`).
"""

import dataclasses
import hashlib
import json
import os
import re
from typing import Optional, Sequence

import numpy as np

from dp_ftrl_tff import _atomic, _validation
from dp_ftrl_tff import plan as plan_lib

CANARY_FILE = 'canaries.json'
PROJECTIONS_FILE = 'canaries.csv'
FORMAT = 3
#: A run identity: 32 lowercase hex digits (128 random bits).
RUN_ID_PATTERN = '[0-9a-f]{32}'
#: The plan fields a report may replace (`privacy_report --rounds/--min_sep/--target_delta`, the
#: report of a run's first rounds): left out of `plan_digest`.
_REPLACEABLE_PLAN_FIELDS = ('num_rounds', 'participation', 'target_delta')
#: A computed cosine may pass +-1 by rounding (float32 projections over a float64 norm); beyond this
#: it is not a cosine.
_COSINE_ROUNDING = 1e-6


def plan_digest(plan: plan_lib.RunPlan) -> str:
  """The SHA-256 (hex) of what the plan states about the run, without the fields a report may
  replace (rounds, declared participation, target delta): the strategy (arrays by their digest),
  noise, clip, cohorts, sampling, restarts and population. Equal for a plan and its `plan.json`."""
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a RunPlan, got {plan!r}.')
  config = plan.to_config(fingerprint_arrays=True)
  for key in _REPLACEABLE_PLAN_FIELDS:
    del config[key]
  return hashlib.sha256(json.dumps(config, sort_keys=True).encode('utf-8')).hexdigest()


def check_run_id(run_id: Optional[str], name: str) -> Optional[str]:
  """`run_id` if it is None or a run identity (`RUN_ID_PATTERN`); ValueError naming `name`."""
  if run_id is not None and (not isinstance(run_id, str)
                             or not re.fullmatch(RUN_ID_PATTERN, run_id)):
    raise ValueError(f'`{name}` must be a run identity of 32 hex digits or None, got {run_id!r}.')
  return run_id


def _header(num_directions: int) -> str:
  return 'round,' + ','.join(f'p{i}' for i in range(num_directions)) + '\n'


def _check_floats(values, name: str, length: int) -> list:
  array = _validation.check_float_array(values, name, 1)
  if array.shape != (length,):
    raise ValueError(f'`{name}` must have {length} entries, got {array.size}.')
  return [float(x) for x in array]


def _check_cosines(values, name: str, length: int) -> list:
  cosines = _check_floats(values, name, length)
  outside = [x for x in cosines if abs(x) > 1]
  if outside:
    raise ValueError(f'`{name}` must be cosines in [-1, 1], got {outside[0]!r}.')
  return cosines


def _check_distinct(client_ids: Sequence[str], name: str) -> None:
  seen = set()
  for client in client_ids:
    if client in seen:
      raise ValueError(f'`{name}` lists the canary {client!r} twice: canary ids must be distinct.')
    seen.add(client)


class CanaryFilesWriter:
  """Writes `canaries.json` and `canaries.csv` into a run directory."""

  def __init__(self, directory, seen: int, seed: int, client_ids: Sequence[str], dimension: int,
               *, plan: plan_lib.RunPlan, run_id: Optional[str] = None):
    """Args: directory: the run directory (created if missing); seen: N >= 1 (as many unseen);
    seed: the canary directions' seed (>= 0); client_ids: the N distinct seen canary clients' ids
    (clients of the plan's population); dimension: d, the number of model parameters; plan: the
    run's `RunPlan` (its population and `plan_digest` are recorded); run_id: the run's identity
    (`RUN_ID_PATTERN`), or None for canaries of no recorded run."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
      raise ValueError(f'`directory` must be a non-empty path, got {directory!r}.')
    self._seen = _validation.check_positive_int(seen, 'seen')
    self._seed = _validation.check_nonnegative_int(seed, 'seed')
    self._dimension = _validation.check_positive_int(dimension, 'dimension')
    if isinstance(client_ids, str) or len(client_ids) != self._seen:
      raise ValueError(f'`client_ids` must list {self._seen} ids, got {client_ids!r}.')
    self._client_ids = [str(c) for c in client_ids]
    _check_distinct(self._client_ids, 'client_ids')
    self._plan_sha256 = plan_digest(plan)
    self._run_id = check_run_id(run_id, 'run_id')
    self._population = plan.population
    if self._population is not None and self._seen > self._population:
      raise ValueError(f'`client_ids`: {self._seen} canaries, but the plan\'s population is '
                       f'{self._population} clients (the canaries included).')
    self._directory = os.fspath(directory)
    os.makedirs(self._directory, exist_ok=True)
    self._metadata_path = os.path.join(self._directory, CANARY_FILE)
    self._projections_path = os.path.join(self._directory, PROJECTIONS_FILE)

  @property
  def path(self) -> str:
    """The path of `canaries.json` (what `read_canaries` takes)."""
    return self._metadata_path

  def write_metadata(self, final_cosines: Optional[list] = None) -> None:
    """Writes `canaries.json` atomically, and the CSV header if the CSV does not exist yet."""
    metadata = {'format': FORMAT, 'seen': self._seen, 'unseen': self._seen, 'seed': self._seed,
                'norm': 'clip', 'client_ids': self._client_ids, 'dimension': self._dimension,
                'population': self._population, 'plan_sha256': self._plan_sha256,
                'run_id': self._run_id, 'final_model_cosines': final_cosines}
    _atomic.write_text(self._metadata_path, json.dumps(metadata, indent=1) + '\n')
    if not os.path.exists(self._projections_path):
      _atomic.write_text(self._projections_path, _header(2 * self._seen))

  def append_round(self, round_num: int, projections) -> None:
    """Appends the row of 0-based round `round_num` (2N projections) and flushes to disk."""
    round_num = _validation.check_nonnegative_int(round_num, 'round_num')
    values = _check_floats(projections, 'projections', 2 * self._seen)
    line = ','.join([str(round_num)] + [repr(x) for x in values]) + '\n'
    with open(self._projections_path, 'a', encoding='utf-8') as f:
      f.write(line)
      f.flush()
      os.fsync(f.fileno())

  def write_final(self, cosines) -> None:
    """Records the final model delta's cosines with the 2N directions in `canaries.json` (rounding
    past +-1 by at most 1e-6 is clipped; more is a ValueError)."""
    values = _check_floats(cosines, 'cosines', 2 * self._seen)
    beyond = [x for x in values if abs(x) > 1 + _COSINE_ROUNDING]
    if beyond:
      raise ValueError(f'`cosines` must be cosines in [-1, 1], got {beyond[0]!r}.')
    self.write_metadata([min(1.0, max(-1.0, x)) for x in values])


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compare fields explicitly
class CanaryRecord:
  """A run's canaries as read back.

  Attributes:
    client_ids: tuple of the N distinct seen canary clients' ids.
    seed: the directions' seed.
    dimension: d, the number of model parameters.
    round_projections: float64 (2N, rounds): P[i, t] / clip over 0-based rounds (seen rows first).
    final_cosines: float64 (2N,) final-model cosines in [-1, 1], or None if the run did not finish.
    population: the run's population (its plan's, canaries included), or None when not recorded.
    plan_sha256: `plan_digest` of the run's plan, or None when not recorded (a record built in
      memory).
    run_id: the identity of the run that wrote it, or None when not recorded.
  """
  client_ids: tuple
  seed: int
  dimension: int
  round_projections: np.ndarray
  final_cosines: Optional[np.ndarray]
  population: Optional[int] = None
  plan_sha256: Optional[str] = None
  run_id: Optional[str] = None

  @property
  def num_seen(self) -> int:
    return len(self.client_ids)

  @property
  def num_rounds(self) -> int:
    return self.round_projections.shape[1]


def _read_metadata(path: str) -> dict:
  try:
    with open(path, encoding='utf-8') as f:
      metadata = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f'{path}: cannot read the canary file ({type(e).__name__}: {e}).') from None
  expected = {'format', 'seen', 'unseen', 'seed', 'norm', 'client_ids', 'dimension',
              'population', 'plan_sha256', 'run_id', 'final_model_cosines'}
  if not isinstance(metadata, dict) or set(metadata) != expected:
    keys = sorted(metadata) if isinstance(metadata, dict) else type(metadata).__name__
    raise ValueError(f'{path}: expected the keys {sorted(expected)}, got {keys}.')
  if metadata['format'] != FORMAT or metadata['norm'] != 'clip':
    raise ValueError(f'{path}: unsupported format {metadata["format"]!r} / norm '
                     f'{metadata["norm"]!r} (expected {FORMAT} / "clip").')
  seen = metadata['seen']
  if (not isinstance(seen, int) or isinstance(seen, bool) or seen < 1
      or metadata['unseen'] != seen):
    raise ValueError(f'{path}: "seen" and "unseen" must be the same positive integer, got '
                     f'{seen!r} and {metadata["unseen"]!r}.')
  ids = metadata['client_ids']
  if not isinstance(ids, list) or len(ids) != seen or not all(isinstance(c, str) for c in ids):
    raise ValueError(f'{path}: "client_ids" must be a list of {seen} strings.')
  try:
    _check_distinct(ids, 'client_ids')
  except ValueError as e:
    raise ValueError(f'{path}: {e}') from None
  population = metadata['population']
  if population is not None and (not isinstance(population, int) or isinstance(population, bool)
                                 or population < seen):
    raise ValueError(f'{path}: "population" must be null or an integer >= "seen" ({seen}), got '
                     f'{population!r}.')
  digest = metadata['plan_sha256']
  if not isinstance(digest, str) or not re.fullmatch('[0-9a-f]{64}', digest):
    raise ValueError(f'{path}: "plan_sha256" must be a SHA-256 in hex, got {digest!r}.')
  try:
    check_run_id(metadata['run_id'], 'run_id')
  except ValueError as e:
    raise ValueError(f'{path}: {e}') from None
  for key, smallest in (('seed', 0), ('dimension', 1)):
    value = metadata[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < smallest:
      raise ValueError(f'{path}: "{key}" must be an integer >= {smallest}, got {value!r}.')
  return metadata


def _read_projections(path: str, num_directions: int) -> np.ndarray:
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except OSError as e:
    raise ValueError(f'{path}: cannot read the canary projections ({e.strerror}).') from None
  lines = text.split('\n')
  if lines[0] + '\n' != _header(num_directions):
    raise ValueError(f'{path}: the header is not "round,p0,...,p{num_directions - 1}".')
  rows = lines[1:-1]  # the last element is '' after a final newline, else a torn line: dropped
  values = np.empty((len(rows), num_directions))
  for t, line in enumerate(rows):
    fields = line.split(',')
    try:
      if len(fields) != num_directions + 1 or int(fields[0]) != t:
        raise ValueError
      values[t] = [float(x) for x in fields[1:]]
    except ValueError:
      raise ValueError(f'{path}: row {t + 2} must be round {t} followed by {num_directions} '
                       'numbers.') from None
  if not np.all(np.isfinite(values)):
    raise ValueError(f'{path}: the projections must be finite.')
  return values.T


def read_canaries(path) -> CanaryRecord:
  """Reads `canaries.json` at `path` and the `canaries.csv` beside it.

  Rows must be the rounds 0 .. R-1 in order; a torn last line (no final newline: a killed writer) is
  dropped.

  Raises:
    ValueError: naming the file and what is wrong, on a missing, corrupt or inconsistent file.
  """
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    raise ValueError(f'`path` must be a non-empty path, got {path!r}.')
  path = os.fspath(path)
  metadata = _read_metadata(path)
  num_directions = 2 * metadata['seen']
  cosines = metadata['final_model_cosines']
  if cosines is not None:
    try:
      cosines = _check_cosines(cosines, 'final_model_cosines', num_directions)
    except ValueError as e:
      raise ValueError(f'{path}: {e}') from None
    cosines = np.array(cosines)
  projections = _read_projections(os.path.join(os.path.dirname(path), PROJECTIONS_FILE),
                                  num_directions)
  return CanaryRecord(client_ids=tuple(metadata['client_ids']), seed=metadata['seed'],
                      dimension=metadata['dimension'], round_projections=projections,
                      final_cosines=cosines, population=metadata['population'],
                      plan_sha256=metadata['plan_sha256'], run_id=metadata['run_id'])
