"""The population writer against TFF's own SQL client-data writer and reader."""

import collections
import os
import sqlite3
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from experiments.run import sqlite_population

pytestmark = pytest.mark.unit


def _population(num_clients=4):
  """Clients of 1..num_clients examples: float images with special values, ints and strings."""
  rng = np.random.default_rng(0)
  clients = collections.OrderedDict()
  for i in range(num_clients):
    n = i + 1
    pixels = rng.standard_normal((n, 3, 2)).astype(np.float32)
    pixels.flat[0] = [-0.0, np.inf, -np.inf, 1e-45][i % 4]  # -0, infinities, a float32 subnormal
    clients[f'client_{i}'] = collections.OrderedDict(
        label=rng.integers(-2**40, 2**40, n), pixels=pixels,
        text=np.array([f'w{i} \u00e9{j}' for j in range(n)]))
  return clients


_SPEC = collections.OrderedDict(label=tf.TensorSpec([], tf.int64),
                                pixels=tf.TensorSpec([3, 2], tf.float32),
                                text=tf.TensorSpec([], tf.string))


def _elements(client_data, client_id):
  return [{k: v.numpy() for k, v in e.items()}
          for e in client_data.create_tf_dataset_for_client(client_id)]


def test_tff_reads_every_value_in_order():
  clients = _population()
  path = sqlite_population.write_population(clients.items())
  read = tff.simulation.datasets.load_and_parse_sql_client_data(path, _SPEC, split_name='train')
  assert read.client_ids == sorted(clients)
  for client_id, columns in clients.items():
    elements = _elements(read, client_id)
    assert len(elements) == len(columns['label'])
    for j, element in enumerate(elements):
      assert element['label'] == columns['label'][j]
      np.testing.assert_array_equal(element['pixels'].view(np.uint32),  # bit for bit
                                    columns['pixels'][j].view(np.uint32))
      assert element['text'].decode() == columns['text'][j]


def test_rows_equal_tffs_writer(tmp_path):
  clients = _population()
  ours = sqlite_population.write_population(clients.items(), split_name='train')
  theirs = str(tmp_path / 'tff.sqlite')
  tff.simulation.datasets.save_to_sql_client_data(
      list(clients), lambda c: tf.data.Dataset.from_tensor_slices(clients[c]), theirs,
      split_names_by_client_id={c: 'train' for c in clients})

  def rows(path):
    with sqlite3.connect(path) as connection:
      examples = [(s, c, tf.train.Example.FromString(b)) for s, c, b in connection.execute(
          'SELECT * FROM examples ORDER BY rowid')]
      metadata = list(connection.execute('SELECT * FROM client_metadata ORDER BY rowid'))
    return examples, metadata

  assert rows(ours) == rows(theirs)


def test_a_clients_query_uses_the_index():
  path = sqlite_population.write_population(_population().items())
  with sqlite3.connect(path) as connection:
    plan = ' '.join(row[-1] for row in connection.execute(
        "EXPLAIN QUERY PLAN SELECT serialized_example_proto FROM examples WHERE client_id = "
        "'client_1' and split_name ='train'"))
  assert 'USING INDEX examples_by_client' in plan


@pytest.mark.e2e  # a Python process that exits
def test_the_file_is_removed_when_python_exits():
  code = ('from experiments.run import sqlite_population; import numpy as np\n'
          "print(sqlite_population.write_population([('a', {'x': np.zeros((2, 1))})]))")
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  path = result.stdout.strip().splitlines()[-1]
  assert path.endswith(sqlite_population.FILE_NAME)
  assert not os.path.exists(os.path.dirname(path))


def test_a_killed_processs_file_is_removed_by_the_next_writer(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  with open('/proc/sys/kernel/pid_max') as f:
    gone = int(f.read()) + 1  # a PID no process can have
  orphan = tmp_path / f'dp_ftrl_tff_population_{gone}_abc'
  alive = tmp_path / f'dp_ftrl_tff_population_{os.getpid()}_abc'
  other = tmp_path / 'dp_ftrl_tff_population_notapid'
  for directory in (orphan, alive, other):
    directory.mkdir()
  path = sqlite_population.write_population([('a', {'x': np.zeros(1)})])
  assert not orphan.exists() and alive.exists() and other.exists()
  assert os.path.dirname(path).startswith(str(tmp_path / f'dp_ftrl_tff_population_{os.getpid()}_'))


@pytest.mark.parametrize('clients, split_name, message', [
    ([('a', {'x': np.zeros(1)}), ('a', {'x': np.zeros(1)})], 'train', "'a' is repeated"),
    ([('a', {'x': np.zeros(0)})], 'train', "'a' has no examples"),
    ([('a', {'x': np.zeros(2), 'y': np.zeros(3)})], 'train', 'different lengths'),
    ([('a', {'x': np.zeros(2, complex)})], 'train', 'dtype complex128'),
    ([('a', {'x': np.zeros(1)})], '', '`split_name`'),
])
def test_bad_input_is_one_value_error(clients, split_name, message):
  with pytest.raises(ValueError, match=message):
    sqlite_population.write_population(clients, split_name=split_name)
