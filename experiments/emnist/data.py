"""Federated EMNIST data for the driver: a synthetic population, TFF's cache, or a local SQLite file.

All sources yield TFF's EMNIST element format: `OrderedDict(label=int32[], pixels=float32[28, 28])`,
pixels in [0, 1]. TFF's own `emnist.get_synthetic()` has 2 clients, too few for min-sep sampling, so
`synthetic_client_data` builds a population of many clients with a learnable signal: each class has a
fixed random smooth prototype image, an example is its class prototype plus pixel noise, and each
client holds a label-skewed mix of classes (non-IID, like writers in EMNIST). Everything is generated
deterministically from a seed with numpy; nothing touches the network. The population is written to
a temporary SQLite file (`experiments.run.sqlite_population`) and read like a real one.
"""

import collections
import os
import sqlite3
from typing import Tuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import memory
from experiments.run import sqlite_data, sqlite_population

IMAGE_SIZE = 28
_SQLITE_NAME = 'emnist_all.sqlite'  # what TFF's `emnist.load_data` caches (decompressed)


def _prototypes(num_classes: int, rng: np.random.Generator) -> np.ndarray:
  """num_classes smooth random images in [0, 1]: random strokes blurred by a 5x5 box filter."""
  raw = (rng.random((num_classes, IMAGE_SIZE + 4, IMAGE_SIZE + 4)) < 0.08).astype(np.float64)
  blurred = sum(raw[:, i:i + IMAGE_SIZE, j:j + IMAGE_SIZE] for i in range(5) for j in range(5))
  return np.clip(blurred / 4.0, 0.0, 1.0)


def _make_examples(prototypes, labels, noise, rng):
  pixels = prototypes[labels] + noise * rng.standard_normal((labels.size, IMAGE_SIZE, IMAGE_SIZE))
  return collections.OrderedDict(label=labels.astype(np.int32),
                                 pixels=np.clip(pixels, 0.0, 1.0).astype(np.float32))


#: What `synthetic_client_data` costs on this project's machine type (time.perf_counter): bytes an
#: example takes in the population's file (float32 28 x 28 pixels and an int32 label; the file may
#: live in memory, a tmpfs), about 230 us a client and 42 us an example, written to its file
#: included (2.16 s for 2000 clients of 20, 4.35 s for 500 of 200). The figures below are lower
#: bounds (about two thirds of the times) for `memory.check_generated_clients`.
_GENERATION_COST = (IMAGE_SIZE * IMAGE_SIZE * 4 + 4, 150e-6, 28e-6)


def synthetic_client_data(
    num_clients: int, *, examples_per_client: int = 20, num_classes: int = 10, seed: int = 0,
    noise: float = 0.6, label_skew: float = 0.5,
) -> Tuple[tff.simulation.datasets.ClientData, tf.data.Dataset]:
  """A synthetic federated EMNIST population and a centralized test set.

  Args:
    num_clients: number of clients (ids 'synthetic_00000', ...).
    examples_per_client: mean examples per client; each client holds between half and 1.5 times it.
    num_classes: 10 (digits) or 62 (EMNIST-62).
    seed: the whole population is a pure function of the arguments.
    noise: std of the Gaussian pixel noise around the class prototype (signal in [0, 1]).
    label_skew: Dirichlet concentration of each client's label mix; small values are more non-IID.

  Returns:
    (train ClientData read from a temporary SQLite file that lives as long as the Python process,
    test dataset of 2000 examples in the same element format).

  Raises:
    ValueError: naming the argument; a population too large for the memory or for an hour of
      generation (`memory.check_generated_clients`) names `num_clients` and `examples_per_client`.
  """
  num_clients = _validation.check_positive_int(num_clients, 'num_clients')
  examples_per_client = _validation.check_positive_int(examples_per_client, 'examples_per_client')
  num_classes = _validation.check_one_of(num_classes, 'num_classes', (10, 62))
  seed = _validation.check_nonnegative_int(seed, 'seed')
  memory.check_generated_clients(num_clients, examples_per_client, *_GENERATION_COST)
  noise = _validation.check_nonnegative_float(noise, 'noise')
  label_skew = _validation.check_positive_float(label_skew, 'label_skew')
  rng = np.random.default_rng([seed, 0])
  prototypes = _prototypes(num_classes, rng)
  width = len(str(num_clients - 1))

  def clients():
    for i in range(num_clients):
      client_rng = np.random.default_rng([seed, 1, i])
      size = int(client_rng.integers(max(1, examples_per_client // 2),
                                     examples_per_client + examples_per_client // 2 + 1))
      mix = client_rng.dirichlet(np.full(num_classes, label_skew))
      labels = client_rng.choice(num_classes, size=size, p=mix)
      yield f'synthetic_{i:0{width}d}', _make_examples(prototypes, labels, noise, client_rng)

  test_rng = np.random.default_rng([seed, 2])
  test = _make_examples(prototypes, test_rng.integers(0, num_classes, 2000), noise, test_rng)
  return (_sql_split(sqlite_population.write_population(clients()), 'train'),
          tf.data.Dataset.from_tensor_slices(test))


def _parse_tff_example(serialized: tf.Tensor) -> collections.OrderedDict:
  """Parses one serialized `tf.train.Example` of TFF's EMNIST SQLite file."""
  parsed = tf.io.parse_example(serialized, {
      'pixels': tf.io.FixedLenFeature(shape=(IMAGE_SIZE, IMAGE_SIZE), dtype=tf.float32),
      'label': tf.io.FixedLenFeature(shape=(), dtype=tf.int64),
  })
  return collections.OrderedDict(label=tf.cast(parsed['label'], tf.int32), pixels=parsed['pixels'])


def _sql_split(path: str, split_name: str) -> tff.simulation.datasets.ClientData:
  """The clients of `split_name` in the SQLite file at `path`, in TFF's element format."""
  return tff.simulation.datasets.SqlClientData(path, split_name).preprocess(
      lambda ds: ds.map(_parse_tff_example))


def load_client_data(source: str, *, only_digits: bool = True,
                     ) -> Tuple[tff.simulation.datasets.ClientData, tf.data.Dataset]:
  """Real federated EMNIST: 'tff' (TFF's loader, downloads if not cached), a cache directory holding
  TFF's decompressed `emnist_all.sqlite`, or the path of that SQLite file. Never downloads for a path.

  Returns:
    (train ClientData, centralized test dataset) in TFF's element format.

  Raises:
    ValueError: naming `data` and the path, for a missing file or one that is not TFF's EMNIST
      SQLite file (`experiments.run.sqlite_data.check_sqlite_file`), or a corrupt cache of 'tff'.
  """
  if not isinstance(source, str) or not source:
    raise ValueError(f'`source` must be "tff" or a path, got {source!r}.')
  if source == 'tff':
    try:
      train, test = tff.simulation.datasets.emnist.load_data(only_digits=only_digits)
    except sqlite3.Error as error:
      raise ValueError(f'`data`=tff: TFF\'s cached {_SQLITE_NAME} cannot be read ({error}); delete '
                       'it (in ~/.keras/datasets) to download it again.') from None
    return train, test.create_tf_dataset_from_all_clients()
  path = os.path.join(source, _SQLITE_NAME) if os.path.isdir(source) else source
  if not os.path.isfile(path):
    raise ValueError(f'`data`: no EMNIST SQLite file at {path!r} (expected TFF\'s decompressed '
                     f'{_SQLITE_NAME} or a directory holding it).')
  prefix = 'digits_only' if only_digits else 'all'
  sqlite_data.check_sqlite_file(
      path, flag='data', expected=f"TFF's decompressed {_SQLITE_NAME} or a directory holding it",
      splits=(f'{prefix}_train', f'{prefix}_test'),
      features={'pixels': ('float_list', IMAGE_SIZE * IMAGE_SIZE), 'label': ('int64_list', 1)})

  return (_sql_split(path, f'{prefix}_train'),
          _sql_split(path, f'{prefix}_test').create_tf_dataset_from_all_clients())


def preprocess_fn(batch_size: int, num_epochs: int, shuffle_seed: int = 0, shuffle: bool = True):
  """Client preprocessing: `OrderedDict(x=float32[B, 28, 28, 1], y=int32[B, 1])` batches.

  The shuffle is seeded so a client's batches are a pure function of its data (resumable runs).
  `shuffle=False` keeps the data order (the test set: a seeded shuffle reshuffles on every
  iteration, so the examples `--eval_max_examples` takes would depend on how often the dataset was
  iterated before, e.g. differ after a resume).
  """
  batch_size = _validation.check_positive_int(batch_size, 'batch_size')
  num_epochs = _validation.check_positive_int(num_epochs, 'num_epochs')

  def to_xy(element):
    return collections.OrderedDict(x=tf.expand_dims(element['pixels'], -1),
                                   y=tf.reshape(element['label'], [1]))

  def preprocess(dataset: tf.data.Dataset) -> tf.data.Dataset:
    dataset = dataset.map(to_xy)
    if shuffle:
      dataset = dataset.shuffle(128, seed=shuffle_seed)
    return dataset.repeat(num_epochs).batch(batch_size)

  return preprocess
