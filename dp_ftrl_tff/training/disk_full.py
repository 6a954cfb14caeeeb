"""The one line of a write that failed on a full disk: what was being written, that nothing is lost.

`disk_full_message(error)` (the drivers', `experiments.run.driver`) recognizes a
full disk or quota (`is_disk_full`: an OSError with ENOSPC / EDQUOT, or TensorFlow's errors, which
are no OSError, with their text) and names the run file the error names in words (`written_file`:
'the checkpoint after round 3', 'the participation log', ...). Every run file is written so that a
failed write leaves the last checkpoint's state readable (`dp_ftrl_tff.training.run_dir`): the line says
so, and that a rerun after freeing space resumes.
"""

import errno
import os
import re
from typing import Optional

from dp_ftrl_tff.training.run_dir import REPORT_DIR

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = tuple(os.strerror(e) for e in _DISK_FULL_ERRNOS)
# TensorFlow's file errors (a SavedModel checkpoint, the CSV release manager, TensorBoard) are no
# OSError: "<path>; No space left on device".
_TF_PATH = re.compile(r'(\S+); (?:' + '|'.join(map(re.escape, _DISK_FULL_TEXTS)) + ')')
_CHECKPOINT_PART = re.compile(r'^program_state_(\d+)(?:_temp\d+)?$')
_RECORD_PART = re.compile(r'^record_(\d+)\.json')
_WRITTEN = (  # (name pattern, what it is), for the one line of a failed write
    (re.compile(r'^participation\.csv'), 'the participation log'),
    (re.compile(r'^metrics\.csv'), 'the metrics'),
    (re.compile(r'^canaries\.'), 'the canary records'),
    (re.compile(r'^(hparams\.json|plan\.json|mechanism\.)'), 'the run\'s settings'),
    (re.compile(r'^summary\.json'), 'the completion marker'),
    (re.compile(r'^workers\.json'), 'the record of the run\'s TFF workers'),
    (re.compile(r'^run\.lock'), 'the run\'s lock file'),
)
_WRITTEN_DIRS = ((REPORT_DIR, 'the privacy report'), ('tensorboard', 'the TensorBoard events'),
                 ('model', 'the final model'))


def is_disk_full(error: BaseException) -> bool:
  """Whether `error` says the disk (or the user's quota) is full: an OSError with ENOSPC / EDQUOT,
  or another error (TensorFlow's ResourceExhaustedError) with that text."""
  if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
    return True
  return any(text in str(error) for text in _DISK_FULL_TEXTS)


def written_file(path: str) -> str:
  """What the run file at `path` is, in words: 'the checkpoint after round 3' for
  `<run>/checkpoints/program_state_3_temp<k>/saved_model.pb.tmp<x>`, 'the participation log', ...;
  `path` itself when it is none of the run's files."""
  parts = os.path.normpath(path).split(os.sep)
  for part in reversed(parts):
    match = _CHECKPOINT_PART.match(part)
    if match:
      return f'the checkpoint after round {match.group(1)}'
  name = parts[-1]
  match = _RECORD_PART.match(name)
  if match:
    return f'the record of the checkpoint after round {match.group(1)}'
  for pattern, what in _WRITTEN:
    if pattern.match(name):
      return what
  for directory, what in _WRITTEN_DIRS:
    if directory in parts[:-1]:
      return what
  return path


def disk_full_message(error: BaseException) -> Optional[str]:
  """The one line of a failed write on a full disk (`is_disk_full`), or None for another error:
  what was being written (`written_file` of the path the error names) and that nothing is lost.
  Every run file is written so that a failed write leaves the last checkpoint's state readable:
  checkpoints, records and the settings are renamed into place (a left temp file or directory is
  removed at the next start, `RunDirectory.remove_stale_temps`), and the logs' rows after the last
  checkpoint, a torn last line included, are dropped on resume."""
  if not is_disk_full(error):
    return None
  path = getattr(error, 'filename', None) if isinstance(error, OSError) else None
  if path is None:
    match = _TF_PATH.search(str(error))
    path = match.group(1) if match else None
  if isinstance(error, OSError) and error.strerror:
    cause = error.strerror
  else:
    cause = next((text for text in _DISK_FULL_TEXTS if text in str(error)), _DISK_FULL_TEXTS[0])
  if path is None:
    what = 'a run file'
  else:
    path = os.fspath(path)
    what = path if written_file(path) == path else f'{written_file(path)} ({path})'
  return (f'the disk is full ({cause}) while writing {what}. Nothing is lost: free space and '
          'rerun the same command; it resumes from the run\'s last complete checkpoint, if any '
          '(the rounds after it are trained again, identically).')
