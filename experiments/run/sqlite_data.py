"""Checks a driver's SQLite client-data file (TFF's `SqlClientData` schema) before it is read.

A file that is empty, not a SQLite database, truncated (shorter than its header says), without TFF's
tables or the driver's splits, or whose first example is not a `tf.train.Example` with the task's
features is one ValueError naming the flag (backticked, e.g. `data`) and the path, so the driver
exits 2 with one line instead of a library exception (sqlite3's "file is not a database", ...).
Only the header, the small `client_metadata` table and the first example are read: a check of every
row would read gigabytes (StackOverflow). The database is opened read-only.
"""

import os
import sqlite3
import urllib.parse
from typing import Dict, Sequence, Tuple

_HEADER = b'SQLite format 3\x00'
_TABLES = {'examples': ('split_name', 'client_id', 'serialized_example_proto'),
           'client_metadata': ('client_id', 'split_name')}
#: Feature kinds of `check_sqlite_file`'s `features`: the `tf.train.Feature` list field.
KINDS = ('bytes_list', 'float_list', 'int64_list')


def _fail(flag: str, path: str, problem: str, expected: str):
  return ValueError(f'`{flag}`: {path} {problem}; expected {expected}.')


def _check_size(path: str) -> str:
  """The problem of the file's header and size ('' when none): empty, not SQLite, truncated."""
  size = os.path.getsize(path)
  if size == 0:
    return 'is empty'
  with open(path, 'rb') as f:
    header = f.read(100)
  if not header.startswith(_HEADER):
    return 'is not a SQLite database'
  if len(header) < 100:
    return f'is truncated ({size} bytes, less than a SQLite header)'
  page_size = int.from_bytes(header[16:18], 'big')
  page_size = 65536 if page_size == 1 else page_size
  pages = int.from_bytes(header[28:32], 'big')
  # The in-header page count is valid when the change counter matches the version-valid-for field.
  if pages and header[24:28] == header[92:96] and size < pages * page_size:
    return f'is truncated ({size} of its {pages * page_size} bytes)'
  return ''


def _check_example(serialized, features: Dict[str, Tuple[str, int]]) -> str:
  """The problem of one serialized example ('' when none)."""
  from google.protobuf import message  # pylint: disable=g-import-not-at-top
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  if not isinstance(serialized, bytes):
    return f'holds a {type(serialized).__name__} where a serialized tf.train.Example belongs'
  try:
    example = example_pb2.Example.FromString(serialized)
  except message.DecodeError:
    return 'holds an example that is not a serialized tf.train.Example'
  feature_map = example.features.feature
  for name, (kind, length) in features.items():
    if name not in feature_map:
      return f'holds examples without the feature {name!r} (another dataset?)'
    values = getattr(feature_map[name], kind).value
    if feature_map[name].WhichOneof('kind') != kind or len(values) != length:
      return (f'holds examples whose feature {name!r} is not {length} value(s) of '
              f'{kind} (another dataset?)')
  return ''


def check_sqlite_file(path: str, *, flag: str, expected: str, splits: Sequence[str],
                      features: Dict[str, Tuple[str, int]]) -> None:
  """Checks the SQLite client-data file at `path` (an existing file) for a driver.

  Args:
    path: the file.
    flag: the flag that gave it, without dashes (named in backticks in the error).
    expected: what the file should be, for the error (e.g. "TFF's decompressed emnist_all.sqlite").
    splits: the `split_name`s the driver reads; each needs a client in `client_metadata`.
    features: {name: (kind, number of values)} every example must hold, kind one of `KINDS`.

  Raises:
    ValueError: naming `flag` and `path`, for a file that is not such a database.
  """
  try:
    problem = _check_size(path)
  except OSError as error:
    raise _fail(flag, path, f'cannot be read ({error.strerror or error})', expected) from None
  if problem:
    raise _fail(flag, path, problem, expected)
  uri = f'file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro'
  try:
    connection = sqlite3.connect(uri, uri=True)
    try:
      problem = _check_tables(connection, splits)
      row = None if problem else connection.execute(
          'SELECT serialized_example_proto FROM examples LIMIT 1').fetchone()
    finally:
      connection.close()
  except sqlite3.Error as error:
    raise _fail(flag, path, f'cannot be read as SQLite ({error})', expected) from None
  if not problem:
    problem = 'has no examples' if row is None else _check_example(row[0], features)
  if problem:
    raise _fail(flag, path, problem, expected)


def _check_tables(connection: sqlite3.Connection, splits: Sequence[str]) -> str:
  """The problem of the database's tables and splits ('' when none)."""
  tables = {row[0] for row in connection.execute(
      "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
  for table, columns in _TABLES.items():
    if table not in tables:
      return f'has no table `{table}` (not TFF\'s client data)'
    have = {row[1] for row in connection.execute(f'PRAGMA table_info({table})')}
    missing = [c for c in columns if c not in have]
    if missing:
      return f'has a table `{table}` without the column(s) {missing}'
  for split in splits:
    if connection.execute('SELECT 1 FROM client_metadata WHERE split_name = ? LIMIT 1',
                          (split,)).fetchone() is None:
      return f'has no clients of the split {split!r}'
  return ''
