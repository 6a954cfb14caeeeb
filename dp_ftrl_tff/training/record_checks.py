"""The checks of a run directory's files against its checkpoint records.

Three readers trust a run directory only as far as its records (`dp_ftrl_tff.training.checkpoint_records`)
vouch for it:
  * a resume (`check_settings`, `check_plan`, `check_files`): the new command's settings and plan,
    and the run's files up to the checkpoint it resumes from; the rows past it (rounds that were not
    checkpointed) are trimmed afterwards, and a missing or altered canaries.json is rebuilt;
  * a finished run's rerun (`check_finished_run`), before it says that there is nothing to do;
  * the privacy report of a run directory's files (`check_report_inputs`, which
    `experiments.privacy_report` calls): each input that lies in a run directory is checked against
    that directory's latest intact record, and all of them must be of one run (the records' run
    identity: two runs of one plan with other seeds have equal plans, not equal identities).
The last two report on the files instead of rebuilding them, so they are stricter than a resume:
plan.json must be the recorded plan, a finished run's logs hold nothing past what the record
vouches for, and canaries.json holds the final-model cosines its record vouches for. A run
directory (it holds hparams.json or checkpoints/) whose files no intact record vouches for is
refused: an edited plan or log would understate epsilon. Files outside a run directory (a
production log, a hand-written plan) are not checked: they are their caller's word.
"""

import csv
import dataclasses
import json
import os
from typing import List, Optional

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.training import checkpoint_records, run_config, run_dir
from dp_ftrl_tff.training.checkpoint_records import Resumption

#: The settings (hparams keys) a resumed command may change: `run_config.RESUMABLE_CHANGES` and the
#: run directory's location (a run copied or moved elsewhere resumes there).
CHANGEABLE_SETTINGS = frozenset(run_config.RESUMABLE_CHANGES) | frozenset(
    ('root_output_dir', 'experiment_name'))


def _record_name(round_num: int) -> str:
  return checkpoint_records.record_path('', round_num).lstrip(os.sep)


def _changes(recorded: dict, current: dict, unchecked=()) -> Optional[str]:
  """'key: recorded -> current, ...' of the keys outside `unchecked` that differ, or None."""
  changed = sorted(k for k in set(recorded) | set(current)
                   if k not in unchecked and recorded.get(k) != current.get(k))
  if not changed:
    return None
  return ', '.join(f'{k}: {recorded.get(k)!r} -> {current.get(k)!r}' for k in changed)


def _refuse_changes(resumption: Resumption, recorded: dict, current: dict, unchecked) -> None:
  _refuse(resumption, _changes(recorded, current, unchecked))


def _refuse(resumption: Resumption, details: Optional[str]) -> None:
  if details:
    raise ValueError(
        f'the run was trained up to checkpoint {resumption.round_num} with other settings '
        f'({details}, as {_record_name(resumption.round_num)} records); use the same settings to '
        'resume, or another --experiment_name.')


def check_settings(resumption: Resumption, config: run_config.RunConfig, output_dir: str) -> None:
  """Raises ValueError when the command's settings (`config`) differ from those the checkpoint
  `resumption` resumes from trained with, but for `CHANGEABLE_SETTINGS`; a run without a checkpoint
  is checked against its hparams.json (`run_config.check_hparams`).

  Raises:
    ValueError: other settings.
    run_dir.CorruptRunFileError: (a run without a checkpoint) hparams.json is not valid JSON.
  """
  if not resumption.fresh:
    _refuse_changes(resumption, resumption.record['settings'], run_config.hparams_document(config),
                    CHANGEABLE_SETTINGS)
  else:
    run_config.check_hparams(config, output_dir)


def check_plan(resumption: Resumption, plan: dict) -> None:
  """Raises ValueError when the command's `plan` (`checkpoint_records.plan_document`) differs from
  the plan the checkpoint `resumption` resumes from trained with, but for
  `plan.RESUMABLE_FIELDS` (e.g. a calibrated noise multiplier that another --target_delta would
  change): `plan.resume_changes`, the rule the data source's iterator holds a resume to."""
  if not resumption.fresh:
    _refuse(resumption, ', '.join(plan_lib.resume_changes(resumption.record['plan'], plan)))


def _file_problem(name: str, expected: dict, data: Optional[bytes], round_num: int,
                  exact: bool) -> Optional[str]:
  """How the run file `name`'s bytes `data` (None: missing) differ from what the record of
  checkpoint `round_num` says (`expected`), or None. Not `exact` (a resume): an append-only log
  may hold more (rows of rounds not checkpointed) and canaries.json's final cosines are not
  compared (a resume rewrites them). `exact` (a finished run, a report): neither is allowed."""
  if data is None:
    return 'it is missing'
  if name == checkpoint_records.CANARY_METADATA:
    try:
      found = checkpoint_records.canary_digests(data)
    except (UnicodeDecodeError, ValueError):
      return 'it is not a JSON object'
    if found['sha256'] != expected['sha256']:
      return 'its metadata was altered'
    if exact and found['final_sha256'] != expected.get('final_sha256'):
      return 'its final-model cosines differ from those recorded at the end of the run'
    return None
  if name == run_dir.METRICS_FILE:
    try:
      found = checkpoint_records.metrics_rows_digest(data, round_num)
    except (UnicodeDecodeError, ValueError, csv.Error) as error:
      return f'it does not parse: {error}'
    if found['rows'] != expected['rows']:
      return f'{found["rows"]} rows for the first {round_num} rounds, recorded {expected["rows"]}'
    if found['sha256'] != expected['sha256']:
      return f'the rows of the first {round_num} rounds were altered'
    return None
  if 'size' in expected:
    if len(data) < expected['size']:
      return f'{len(data)} bytes, recorded {expected["size"]}'
    if checkpoint_records.sha256(data[:expected['size']]) != expected['sha256']:
      return f'its first {expected["size"]} bytes were altered'
    if exact and len(data) > expected['size']:
      return (f'{len(data) - expected["size"]} bytes past the {expected["size"]} recorded at the '
              'end of the run')
    return None
  if checkpoint_records.sha256(data) != expected['sha256']:
    return 'its contents were altered'
  return None


def _file_error(path: str, problem: str, round_num: int,
                remedy: str = checkpoint_records.REMEDY) -> run_dir.RunDirError:
  return run_dir.CorruptRunFileError(
      f'{path} does not hold what checkpoint {round_num} recorded ({problem}, see '
      f'{_record_name(round_num)}); {remedy}')


def check_files(output_dir: str, resumption: Resumption, names=None) -> List[str]:
  """Checks the run's files (those among `names`, default all) against the record of the checkpoint
  `resumption` resumes from (reading only); returns the names of files to rebuild from the verified
  settings (canaries.json that is missing or altered).

  Raises:
    run_dir.CorruptRunFileError: a log, metrics.csv or the strategy file is missing, shorter than
      recorded, or differs from the record (naming the file).
  """
  rebuild = []
  if resumption.fresh:
    return rebuild
  for name, expected in resumption.record['files'].items():
    if names is not None and name not in names:
      continue
    path = os.path.join(output_dir, name)
    data = checkpoint_records.read_bytes(path)
    problem = _file_problem(name, expected, data, resumption.round_num, exact=False)
    if name != checkpoint_records.CANARY_METADATA:
      if problem is not None:
        raise _file_error(path, problem, resumption.round_num)
    elif problem is not None or _file_problem(name, expected, data, resumption.round_num,
                                              exact=True) is not None:
      # Rebuilt without final cosines when they differ from the record's too: the run's end then
      # computes them again from the final model.
      rebuild.append(name)
  return rebuild


def check_rebuilt(output_dir: str, resumption: Resumption, names) -> None:
  """Raises `run_dir.CorruptRunFileError` if a file among `names`, rebuilt from the verified
  settings (canaries.json without final cosines), still differs from the record."""
  for name in names:
    path = os.path.join(output_dir, name)
    if _file_problem(name, resumption.record['files'][name], checkpoint_records.read_bytes(path),
                     resumption.round_num, exact=False) is not None:
      raise _file_error(path, "rebuilt from the run's settings, it still differs",
                        resumption.round_num)


def _plan_problem(path: str, resumption: Resumption) -> Optional[str]:
  """How the plan file at `path` differs from the plan `resumption`'s record holds, or None."""
  data = checkpoint_records.read_bytes(path)
  if data is None:
    return 'it is missing'
  try:
    document = json.loads(data.decode('utf-8'))
  except (UnicodeDecodeError, ValueError):
    return 'it is not valid JSON'
  if not isinstance(document, dict):
    return 'it is not a JSON object'
  changes = _changes(resumption.record['plan'], document)
  return None if changes is None else f'recorded -> now: {changes}'


def check_finished_run(output_dir: str, resumption: Resumption) -> None:
  """Checks a finished run's files before its rerun says that there is nothing to do (reading
  only): plan.json must be the plan of the checkpoint `resumption` (its last), and every file
  the record vouches for must hold exactly that.

  Raises:
    run_dir.CorruptRunFileError: naming the file (plan.json: --force_report rewrites it from the
      record).
  """
  if resumption.fresh:
    return
  plan_path = os.path.join(output_dir, run_dir.PLAN_FILE)
  problem = _plan_problem(plan_path, resumption)
  if problem is not None:
    raise _file_error(plan_path, problem, resumption.round_num,
                      'rerun with --force_report: it rewrites plan.json from the record and the '
                      'report from the verified files.')
  for name, expected in resumption.record['files'].items():
    path = os.path.join(output_dir, name)
    problem = _file_problem(name, expected, checkpoint_records.read_bytes(path),
                            resumption.round_num, exact=True)
    if problem is not None:
      raise _file_error(path, problem, resumption.round_num)


def is_run_directory(directory: str) -> bool:
  """Whether `directory` holds a training run (of a driver, or of the train_model program of earlier
  releases)."""
  return (os.path.isfile(os.path.join(directory, run_dir.HPARAMS_FILE))
          or os.path.isdir(checkpoint_records.checkpoints_dir(directory)))


@dataclasses.dataclass(frozen=True)
class VouchedRun:
  """What the latest intact record of a run directory vouches for: the run's `directory`, its
  identity `run_id`, the rounds it trained (`trained_rounds`, its last checkpoint's) and the rounds
  its recorded plan has (`planned_rounds`)."""
  directory: str
  run_id: str
  trained_rounds: int
  planned_rounds: int

  @property
  def finished(self) -> bool:
    return self.trained_rounds >= self.planned_rounds


class UnvouchedInputError(ValueError):
  """An input of a report that lies in a run directory but is not what the run's records vouch
  for (edited after the run, of another run, or with no intact record to check it against)."""


def _latest_record(directory: str, flag: str, path: str) -> Resumption:
  """The latest intact record of the run in `directory` (which holds the input `flag`'s `path`)."""
  why = f'{checkpoint_records.checkpoints_dir(directory)} holds no checkpoint with an intact record'
  try:
    resumption = checkpoint_records.find_resumption(directory)
  except run_dir.RunDirError:
    resumption = None
  if resumption is None or resumption.fresh:
    raise UnvouchedInputError(
        f'`{flag}`: {path} is a file of the run in {directory}, but {why}: its files cannot be '
        'checked, and an edited plan or log would understate epsilon. Restore the run\'s '
        'checkpoints/ from a backup; to report on copies you vouch for yourself, copy them out of '
        'the run directory.')
  return resumption


def _check_input(flag: str, path: str, resumption: Resumption) -> None:
  """Checks the report input `flag` at `path` against the record of `resumption`."""
  record, round_num = resumption.record, resumption.round_num
  finished = round_num >= record['plan'].get('num_rounds', round_num)
  if flag == 'plan':
    problem = _plan_problem(path, resumption)
  else:
    names = {'participation_log': (run_dir.PARTICIPATION_FILE,),
             'metrics': (run_dir.METRICS_FILE,),
             'canaries': (checkpoint_records.CANARY_METADATA, auditing.PROJECTIONS_FILE)}[flag]
    problem = None
    for name in names:
      if name not in record['files']:
        if flag == 'metrics':  # an earlier release's train_model program recorded none
          continue
        problem = f'the run recorded no {name}'
        break
      file_path = path if name == names[0] else os.path.join(os.path.dirname(path), name)
      problem = _file_problem(name, record['files'][name],
                              checkpoint_records.read_bytes(file_path), round_num, exact=finished)
      if problem is not None:
        path = file_path
        break
  if problem is not None:
    raise UnvouchedInputError(
        f'`{flag}`: {path} does not hold what checkpoint {round_num} of its run recorded '
        f'({problem}; see {_record_name(round_num)}): it was changed after the run, and a report '
        'on it could understate epsilon. Restore the file, or rerun the run\'s command with '
        '--force_report, which rebuilds the report from the verified files.')


def check_report_inputs(**inputs: Optional[str]) -> Optional[VouchedRun]:
  """Checks a report's inputs (keyword: `plan`, `participation_log`, `metrics`, `canaries`; the
  path of each, or None) that lie in a run directory against its latest intact record (reading
  only); returns what the record of the log's run (else the plan's, ...) vouches for, or None when
  no input lies in a run directory.

  Raises:
    UnvouchedInputError (a ValueError): naming the input: a run directory without an intact record,
      an input that is not what the record vouches for, or inputs of two runs.
  """
  unknown = set(inputs) - {'plan', 'participation_log', 'metrics', 'canaries'}
  if unknown:
    raise ValueError(f'unknown report inputs {sorted(unknown)}.')
  runs, vouched = {}, []
  for flag in ('participation_log', 'plan', 'metrics', 'canaries'):
    path = inputs.get(flag)
    if path is None:
      continue
    directory = os.path.dirname(os.path.abspath(path))
    if not is_run_directory(directory):
      continue
    if directory not in runs:
      runs[directory] = _latest_record(directory, flag, path)
    _check_input(flag, path, runs[directory])
    vouched.append((flag, path, directory))
  if not vouched:
    return None
  first_flag, first_path, first_dir = vouched[0]
  for flag, path, directory in vouched[1:]:
    if runs[directory].run_id != runs[first_dir].run_id:
      raise UnvouchedInputError(
          f'`{flag}`: {path} is of the run {runs[directory].run_id} (in {directory}), '
          f'`{first_flag}` {first_path} of the run {runs[first_dir].run_id} (in {first_dir}): a '
          'report reads the files of one run.')
  resumption = runs[first_dir]
  return VouchedRun(first_dir, resumption.run_id, resumption.round_num,
                    int(resumption.record['plan'].get('num_rounds') or resumption.round_num))
