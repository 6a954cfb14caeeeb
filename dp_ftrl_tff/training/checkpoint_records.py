"""What a run's checkpoint vouches for: the settings it trained with and the run's files.

Right after `checkpoints/program_state_<r>` is saved, `checkpoints/record_<r>.json` is written
atomically. It holds:
  * `checkpoint`: the SHA-256 of the checkpoint's files, so a checkpoint damaged or replaced after
    it was saved no longer matches its record;
  * `settings`: the run's hparams document (as in hparams.json) and `plan`: its plan (as in
    plan.json), so a resume compares the new command with what trained, never with a hparams.json
    or plan.json that may be gone or replaced; `run_id`: the run's identity (random, drawn at its
    first start, kept by every resume; also in hparams.json and canaries.json), which binds the
    run's files to this run rather than to another run of the same plan;
  * `files`: what the run's other files held after round r: the strategy file's SHA-256; for the
    append-only logs (participation.csv, canaries.csv) their byte length and the SHA-256 of those
    bytes; for metrics.csv (tff.program's CSV release manager rewrites it whole when a column
    appears) its number of rows and the SHA-256 of their non-empty fields; for canaries.json the
    SHA-256 of its metadata without the final-model cosines, and of those cosines (null until the
    run's end writes them and rewrites the last record, `record_final_files`).

On resume, `find_resumption` takes the latest checkpoint whose record is intact and matches
it. A checkpoint without an intact record (damaged, replaced, or saved by a run killed before it
wrote the record) is named in a warning and moved to `checkpoints/set_aside/`, and the run falls
back to the previous one. `check_files` then compares the run's files with the record: a missing,
shorter or altered log or strategy file is a `RunDirError` naming the file (nothing is derived from
the new command's flags); `trim_files` drops what the logs hold past the record (rounds that were
not checkpointed, a torn last line). hparams.json and plan.json are rewritten from the verified
settings on every start, and canaries.json is rebuilt when it no longer matches, so a deleted or
replaced copy of those comes back exactly.

Every record describes every run file; the records of train_model programs of earlier releases
hold no metrics.csv (their final evaluation rewrote the last row after the last checkpoint).

Why not in the checkpoint itself: `tff.program.FileProgramStateManager` loads a state only with
the structure of the built process, and these checks must run before the 10-20 s of building it.
"""

import csv
import dataclasses
import hashlib
import io
import json
import os
import re
from typing import Dict, List, Optional

from absl import logging

from dp_ftrl_tff import _atomic, auditing
from dp_ftrl_tff.training import run_dir, run_setup

#: The record format this module writes and reads.
FORMAT = 'dp_ftrl_tff.checkpoint_record.v2'
CHECKPOINT_PREFIX = 'program_state_'
SET_ASIDE_DIR = 'set_aside'
_RECORD = re.compile(r'^record_(\d+)\.json$')
_CHECKPOINT = re.compile(rf'^{CHECKPOINT_PREFIX}(\d+)$')
REMEDY = ('restore it from a backup of the run, or start a new run with another '
           '--experiment_name; the run was not resumed.')

# Files whose bytes only grow between checkpoints (the rows of later rounds are appended).
APPEND_ONLY = (run_dir.PARTICIPATION_FILE, auditing.PROJECTIONS_FILE)
CANARY_METADATA = auditing.CANARY_FILE


def plan_document(plan) -> dict:
  """A `RunPlan` as its JSON file holds it (what a record stores and compares)."""
  return json.loads(json.dumps(plan.to_config()))


def checkpoints_dir(output_dir: str) -> str:
  return os.path.join(output_dir, 'checkpoints')


def checkpoint_path(output_dir: str, round_num: int) -> str:
  return os.path.join(checkpoints_dir(output_dir), f'{CHECKPOINT_PREFIX}{round_num}')


def record_path(output_dir: str, round_num: int) -> str:
  return os.path.join(checkpoints_dir(output_dir), f'record_{round_num}.json')


def sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def read_bytes(path: str) -> Optional[bytes]:
  """The bytes of the file at `path`, or None when there is none."""
  try:
    with open(path, 'rb') as f:
      return f.read()
  except FileNotFoundError:
    return None


def tree_digest(path: str) -> str:
  """The SHA-256 of a directory's files (relative paths, sizes and contents, in sorted order)."""
  digest = hashlib.sha256()
  for root, dirs, names in os.walk(path):
    dirs.sort()
    for name in sorted(names):
      file_path = os.path.join(root, name)
      data = read_bytes(file_path)
      digest.update(f'{os.path.relpath(file_path, path)}\0{len(data)}\0'.encode())
      digest.update(data)
  return digest.hexdigest()


def metrics_rows_digest(data: bytes, num_rounds: int) -> Dict[str, object]:
  """{'rows': number of rows of rounds < `num_rounds`, 'sha256': digest of their non-empty fields}
  of metrics.csv's bytes `data`; raises ValueError if they do not parse."""
  rows = []
  for row in csv.DictReader(io.StringIO(data.decode('utf-8'))):
    round_field = row.get('round')
    try:
      round_num = int(round_field)
    except (TypeError, ValueError):
      raise ValueError(f'a row whose round is {round_field!r}') from None
    if round_num < num_rounds:
      rows.append({k: v for k, v in row.items() if k is not None and v not in ('', None)})
  return {'rows': len(rows),
          'sha256': sha256(json.dumps(rows, sort_keys=True).encode('utf-8'))}


def canary_digests(data: bytes) -> Dict[str, Optional[str]]:
  """{'sha256': the SHA-256 of canaries.json's metadata without its final-model cosines,
  'final_sha256': that of the cosines, None before the run's end wrote them}; ValueError if it
  is not a JSON object."""
  document = json.loads(data.decode('utf-8'))
  if not isinstance(document, dict):
    raise ValueError('not a JSON object')
  cosines = document.get('final_model_cosines')
  document = {k: v for k, v in document.items() if k != 'final_model_cosines'}
  return {'sha256': sha256(json.dumps(document, sort_keys=True).encode('utf-8')),
          'final_sha256': None if cosines is None else sha256(json.dumps(cosines).encode())}


def strategy_file_name(output_dir: str) -> Optional[str]:
  """The basename of the strategy file the run saved (mechanism.json / .npz), or None."""
  path = run_setup.saved_strategy_path(output_dir)
  return None if path is None else os.path.basename(path)


#: Everything `describe_files` can describe: the strategy file (named `STRATEGY_FILE` here), the
#: append-only logs, metrics.csv and canaries.json.
STRATEGY_FILE = 'strategy'
ALL_FILES = (STRATEGY_FILE,) + APPEND_ONLY + (run_dir.METRICS_FILE, CANARY_METADATA)


def describe_files(output_dir: str, round_num: int, names=ALL_FILES) -> Dict[str, dict]:
  """What the run's files among `names` hold now, after `round_num` rounds (see the module
  docstring); a file the run has not written yet is left out."""
  files = {}
  for name in names:
    if name == STRATEGY_FILE:
      name = strategy_file_name(output_dir)
    data = None if name is None else read_bytes(os.path.join(output_dir, name))
    if data is None:
      continue
    if name in APPEND_ONLY:
      files[name] = {'size': len(data), 'sha256': sha256(data)}
    elif name == run_dir.METRICS_FILE:
      files[name] = metrics_rows_digest(data, round_num)
    elif name == CANARY_METADATA:
      files[name] = canary_digests(data)
    else:
      files[name] = {'sha256': sha256(data)}
  return files


def write_record(output_dir: str, round_num: int, settings: dict, plan: dict, run_id: str
                 ) -> None:
  """Writes `record_<round_num>.json` for the checkpoint just saved, describing the run's files
  (`ALL_FILES`), and removes the records of checkpoints `tff.program` has since removed."""
  round_num = int(round_num)  # train_model's versions are numpy integers
  record = {'format': FORMAT, 'round': round_num,
            'checkpoint': tree_digest(checkpoint_path(output_dir, round_num)),
            'run_id': auditing.check_run_id(run_id, 'run_id'),
            'settings': settings, 'plan': plan,
            'files': describe_files(output_dir, round_num)}
  _atomic.write_text(record_path(output_dir, round_num), json.dumps(record, indent=1) + '\n')
  for other in _rounds(output_dir, _RECORD):
    if not os.path.isdir(checkpoint_path(output_dir, other)):
      os.remove(record_path(output_dir, other))


def record_final_files(output_dir: str, round_num: int) -> None:
  """Rewrites the record of the run's last checkpoint `round_num` with what the run's end wrote
  after it (canaries.json's final-model cosines), so that the record vouches for them too."""
  path = record_path(output_dir, round_num)
  with open(path, encoding='utf-8') as f:
    record = json.load(f)
  record['files'].update(describe_files(output_dir, round_num, (CANARY_METADATA,)))
  _atomic.write_text(path, json.dumps(record, indent=1) + '\n')


def _rounds(output_dir: str, pattern: re.Pattern) -> List[int]:
  """The rounds of the checkpoints directory's entries whose names match `pattern`."""
  directory = checkpoints_dir(output_dir)
  names = os.listdir(directory) if os.path.isdir(directory) else []
  return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


@dataclasses.dataclass(frozen=True)
class Resumption:
  """Where a run starts: after checkpoint `round_num` with its `record` (a dict as `write_record`
  wrote it), or from scratch (`record` None, `round_num` 0). `untrusted` lists (round, why) of the
  later checkpoints without an intact record, which `set_aside` moves away."""
  round_num: int
  record: Optional[dict]
  untrusted: tuple

  @property
  def fresh(self) -> bool:
    return self.record is None

  @property
  def run_id(self) -> Optional[str]:
    """The identity of the run the checkpoint belongs to (None from scratch)."""
    return None if self.record is None else self.record['run_id']


def _record_problem(output_dir: str, round_num: int) -> Optional[str]:
  """Why checkpoint `round_num` cannot be trusted, or None when its record is intact and matches."""
  path = record_path(output_dir, round_num)
  data = read_bytes(path)
  if data is None:
    return f'it has no record ({os.path.basename(path)} is missing)'
  try:
    record = json.loads(data.decode('utf-8'))
  except (UnicodeDecodeError, json.JSONDecodeError):
    return f'its record {os.path.basename(path)} is not valid JSON'
  if (not isinstance(record, dict) or record.get('format') != FORMAT
      or record.get('round') != round_num
      or not isinstance(record.get('run_id'), str)
      or not re.fullmatch(auditing.RUN_ID_PATTERN, record['run_id'])
      or not all(isinstance(record.get(k), dict) for k in ('settings', 'plan', 'files'))):
    return f'its record {os.path.basename(path)} is not a record of this checkpoint'
  if tree_digest(checkpoint_path(output_dir, round_num)) != record.get('checkpoint'):
    return 'its files differ from what its record says was saved (damaged or replaced)'
  return None


def _has_rows(path: str) -> bool:
  """Whether the CSV file at `path` holds anything past its header line."""
  data = read_bytes(path)
  return data is not None and data.find(b'\n') not in (-1, len(data) - 1)


def find_resumption(output_dir: str) -> Resumption:
  """Where the run in `output_dir` resumes: its latest checkpoint with an intact, matching record
  (reading only). Later checkpoints without one, and later records whose checkpoint is gone, are
  listed in `untrusted`.

  Raises:
    run_dir.RunDirError: the logs hold trained rounds, but no checkpoint has an intact record
      (nothing to resume from exactly; a fresh start would overwrite them).
  """
  checkpoints = _rounds(output_dir, _CHECKPOINT)
  untrusted = [(r, 'it is missing (its record remains)') for r in _rounds(output_dir, _RECORD)
               if r not in checkpoints]
  for round_num in reversed(checkpoints):
    problem = _record_problem(output_dir, round_num)
    if problem is None:
      with open(record_path(output_dir, round_num), encoding='utf-8') as f:
        record = json.load(f)
      return Resumption(round_num, record, tuple(sorted(
          (r, why) for r, why in untrusted if r > round_num)))
    untrusted.append((round_num, problem))
  logs = [name for name in (run_dir.PARTICIPATION_FILE, run_dir.METRICS_FILE)
          if _has_rows(os.path.join(output_dir, name))]
  if logs:
    detail = '; '.join(f'{checkpoint_path(output_dir, r)}: {why}' for r, why in sorted(untrusted))
    raise run_dir.RunDirError(
        f'{output_dir} holds trained rounds ({", ".join(logs)}) but no intact checkpoint to '
        'resume them from (' + (detail or f'{checkpoints_dir(output_dir)} holds none') +
        f'); {REMEDY}')
  return Resumption(0, None, tuple(sorted(untrusted)))


def set_aside(output_dir: str, resumption: Resumption) -> None:
  """Moves the checkpoints without an intact record to `checkpoints/set_aside/` with a warning
  naming each (a missing one is only named): the run redoes their rounds, and nothing is deleted."""
  resumes = 'the start' if resumption.fresh else f'checkpoint {resumption.round_num}'
  for round_num, problem in resumption.untrusted:
    source = checkpoint_path(output_dir, round_num)
    if not os.path.isdir(source):
      logging.warning('Checkpoint %s %s; the run resumes from %s.', source, problem, resumes)
      continue
    target_dir = os.path.join(checkpoints_dir(output_dir), SET_ASIDE_DIR)
    os.makedirs(target_dir, exist_ok=True)
    target = os.path.join(target_dir, os.path.basename(source))
    suffix = 1
    while os.path.exists(target):
      target = os.path.join(target_dir, f'{os.path.basename(source)}.{suffix}')
      suffix += 1
    os.replace(source, target)
    logging.warning('Checkpoint %s cannot be trusted: %s. Moved it to %s; the run resumes from '
                    '%s instead.', source, problem, target, resumes)


def trim_files(output_dir: str, resumption: Resumption) -> None:
  """Drops what the append-only logs hold past the checkpoint `resumption` resumes from's record (the rows of rounds that
  were not checkpointed, a torn last line); call after `check_files`, with the lock held."""
  for name in APPEND_ONLY:
    expected = resumption.record['files'].get(name)
    path = os.path.join(output_dir, name)
    if expected is None:
      continue
    if os.path.getsize(path) > expected['size']:
      with open(path, 'r+b') as f:
        f.truncate(expected['size'])
        f.flush()
        os.fsync(f.fileno())
