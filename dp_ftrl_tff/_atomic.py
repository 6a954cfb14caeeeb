"""Atomic file writes: the one home for writing a file so that a killed writer leaves the old file or
the new one, never part of one (strategy files, plans, the drivers' run files)."""

import contextlib
import os

#: Suffix of the temp files (`<path>.<pid>.tmp`), which readers may delete when stale.
TEMP_SUFFIX = '.tmp'


def write_bytes(path, data: bytes) -> None:
  """Writes `data` to `path`: a temp file in the same directory, fsync, `os.replace`, directory
  fsync. The umask applies to the new file (unlike `tempfile.mkstemp`)."""
  path = os.fspath(path)
  temp = f'{path}.{os.getpid()}{TEMP_SUFFIX}'
  fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(temp)
    raise
  with contextlib.suppress(OSError):
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
      os.fsync(directory)
    finally:
      os.close(directory)


def write_text(path, text: str) -> None:
  """`write_bytes` of UTF-8 `text`."""
  write_bytes(path, text.encode('utf-8'))
