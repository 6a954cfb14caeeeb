"""Atomic file writes: the one home for writing a file so that a killed writer leaves the old file or
the new one, never part of one (strategy files, plans, the drivers' run files)."""

import contextlib
import os

#: Suffix of the temp files (`<path>.<pid>.tmp`), which readers may delete when stale.
TEMP_SUFFIX = '.tmp'


def write_bytes(path, data: bytes) -> None:
  """Writes `data` to `path`: a temp file in the same directory, fsync, `os.replace`, directory
  fsync. The umask applies to the new file (unlike `tempfile.mkstemp`). An OSError of a write
  names `path` (`filename`; a full disk's ENOSPC from `write` or `fsync` names none)."""
  path = os.fspath(path)
  temp = f'{path}.{os.getpid()}{TEMP_SUFFIX}'
  fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temp, path)
  except BaseException as error:
    with contextlib.suppress(OSError):
      os.remove(temp)
    _name(error, path)
    raise
  with contextlib.suppress(OSError):
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
      os.fsync(directory)
    finally:
      os.close(directory)


def _name(error: BaseException, path: str) -> None:
  if isinstance(error, OSError) and error.filename is None:
    error.filename = path


@contextlib.contextmanager
def naming(path):
  """OSErrors of the block name `path` (their `filename`) when they name no file, as a full disk's
  ENOSPC from `write`, `flush` or `fsync` does not: the message of a failed append can say which
  file it was."""
  try:
    yield
  except OSError as error:
    _name(error, os.fspath(path))
    raise


def write_text(path, text: str) -> None:
  """`write_bytes` of UTF-8 `text`."""
  write_bytes(path, text.encode('utf-8'))
