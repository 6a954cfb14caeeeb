"""Writes a generated federated population to a SQLite file of TFF's `SqlClientData` schema.

The drivers' synthetic populations are read like a real dataset file: TFF's dataset computation
queries each client's examples from the file. An in-memory `TestClientData` would embed every
example of the population in that computation as constants (52 MB for 1000 EMNIST clients of 16
examples), which TFF loads again for every client of every round.

TFF's `tff.simulation.datasets.save_to_sql_client_data` writes the same schema, but without an index
on the client id (every client's query would scan the whole table) and one example at a time
through eager tf.data (minutes for a population the drivers generate in seconds); hence this writer.
"""

import atexit
import os
import shutil
import sqlite3
import tempfile
from typing import Iterable, Mapping, Tuple

import numpy as np
import tensorflow as tf

#: The file's name in its temporary directory.
FILE_NAME = 'population.sqlite'
#: The temporary directory's name: this prefix, the writing process's PID, '_', a random suffix.
_PREFIX = 'dp_ftrl_tff_population_'


def _remove_orphans() -> None:
  """Removes the population directories of processes that are gone: a killed driver (SIGKILL runs
  no exit handler) leaves its file behind, and the temporary directory may be in memory (tmpfs)."""
  root = tempfile.gettempdir()
  for name in os.listdir(root):
    pid = name[len(_PREFIX):].split('_', 1)[0] if name.startswith(_PREFIX) else ''
    if not pid.isdigit():
      continue
    try:
      os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
      shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    except PermissionError:  # another user's live process
      pass


def _varint(value: int) -> bytes:
  """`value` (>= 0) as a protobuf base-128 varint."""
  out = bytearray()
  while value > 0x7f:
    out.append(value & 0x7f | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


def _feature(values: np.ndarray):
  """One `tf.train.Feature` holding `values` (one example's column) by its dtype."""
  if values.dtype.kind == 'f':
    # Protobuf converts a list of floats one Python float at a time (100 us for a 28 x 28 image);
    # it parses a FloatList's wire form, field 1 packed (tag 0x0a, byte length, little-endian
    # float32s), in 2 us.
    raw = values.astype('<f4').tobytes()
    return tf.train.Feature(
        float_list=tf.train.FloatList.FromString(b'\x0a' + _varint(len(raw)) + raw))
  if values.dtype.kind in 'iu':
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values.ravel().tolist()))
  if values.dtype.kind in 'US':
    encoded = [v.encode() if isinstance(v, str) else bytes(v) for v in values.ravel().tolist()]
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=encoded))
  raise ValueError(f'`clients`: a column of dtype {values.dtype} has no tf.train.Feature kind.')


def _serialized_examples(columns: Mapping[str, np.ndarray]):
  """The serialized `tf.train.Example`s of one client: element i holds row i of every column."""
  sizes = {len(values) for values in columns.values()}
  if len(sizes) != 1:
    raise ValueError(f'`clients`: a client\'s columns have different lengths {sorted(sizes)}.')
  for i in range(sizes.pop()):
    features = tf.train.Features(
        feature={name: _feature(np.asarray(values[i])) for name, values in columns.items()})
    yield tf.train.Example(features=features).SerializeToString()


def write_population(clients: Iterable[Tuple[str, Mapping[str, np.ndarray]]], *,
                     split_name: str = 'train') -> str:
  """Writes `clients` to a new SQLite file and returns its path.

  Args:
    clients: (client id, columns) pairs in id order; columns maps a feature name to an array whose
      first axis is the client's examples (floats become a `float_list`, integers an `int64_list`,
      strings a `bytes_list`, each example's values flattened in C order). Read lazily.
    split_name: the `split_name` of every row, the split `SqlClientData` is opened with.

  Returns:
    The path of the file, in a temporary directory removed when the Python process exits (or, after
    a kill, by the next call in any process).

  Raises:
    ValueError: a client without examples or with columns of different lengths, a repeated id,
      or a column of a dtype `tf.train.Example` cannot hold (naming `clients`).
  """
  if not isinstance(split_name, str) or not split_name:
    raise ValueError(f'`split_name` must be a non-empty string, got {split_name!r}.')
  _remove_orphans()
  directory = tempfile.mkdtemp(prefix=f'{_PREFIX}{os.getpid()}_')
  atexit.register(shutil.rmtree, directory, ignore_errors=True)
  path = os.path.join(directory, FILE_NAME)
  with sqlite3.connect(path) as connection:
    connection.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
                       'serialized_example_proto BLOB NOT NULL)')
    connection.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, '
                       'split_name TEXT NOT NULL, num_examples INTEGER NOT NULL)')
    seen = set()
    for client_id, columns in clients:
      if client_id in seen:
        raise ValueError(f'`clients`: the client id {client_id!r} is repeated.')
      seen.add(client_id)
      rows = [(split_name, client_id, example) for example in _serialized_examples(columns)]
      if not rows:
        raise ValueError(f'`clients`: the client {client_id!r} has no examples.')
      connection.executemany('INSERT INTO examples VALUES (?, ?, ?)', rows)
      connection.execute('INSERT INTO client_metadata VALUES (?, ?, ?)',
                         (client_id, split_name, len(rows)))
    # Rows of one client keep their insertion (rowid) order under the index: the examples' order.
    connection.execute('CREATE INDEX examples_by_client ON examples (client_id, split_name)')
  connection.close()
  return path
