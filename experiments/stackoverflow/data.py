"""Federated StackOverflow data for the driver: synthetic population, TFF's cache, or a SQLite file.

Element format (TFF's `stackoverflow.load_data`): `OrderedDict(creation_date=string, score=int64,
tags=string, title=string, tokens=string, type=string)`, `tokens` being space-separated words.
The SQLite file follows TFF's schema (`tff.simulation.datasets.SqlClientData`): a table `examples`
(split_name TEXT, client_id TEXT, serialized_example_proto BLOB holding a `tf.train.Example` with the
six features above) and a table `client_metadata` (client_id TEXT, split_name TEXT, num_examples
INTEGER); splits 'train', 'heldout', 'test'.

`synthetic_client_data` builds many clients (TFF's `get_synthetic()` has 3) whose sentences follow a
fixed random Markov chain over a synthetic vocabulary: each word has a few likely successors, so the
next-word model has a learnable signal. It is generated deterministically from a seed with numpy
and written to a temporary SQLite file (`experiments.run.sqlite_population`), read like a real one.

Token ids (TFF research convention, one OOV bucket): pad 0, vocabulary words 1..V, OOV V+1,
beginning of sentence V+2, end of sentence V+3; the model's output size is V+4.
"""

import collections
import os
import sqlite3
from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import memory
from experiments.run import sqlite_data, sqlite_population

_SQLITE_NAME = 'stackoverflow.sqlite'  # what TFF's `stackoverflow.load_data` caches (decompressed)
_WORD_COUNT_NAME = 'stackoverflow.word_count'
_STRING_FEATURES = ('creation_date', 'tags', 'title', 'tokens', 'type')


def special_tokens(vocab_size: int) -> collections.OrderedDict:
  """Ids of pad, oov, bos, eos for a vocabulary of `vocab_size` words."""
  vocab_size = _validation.check_positive_int(vocab_size, 'vocab_size')
  return collections.OrderedDict(pad=0, oov=vocab_size + 1, bos=vocab_size + 2, eos=vocab_size + 3)


def _element(tokens: str, index: int) -> collections.OrderedDict:
  return collections.OrderedDict(
      creation_date='2018-01-01 00:00:00 UTC', score=np.int64(index % 7), tags='synthetic',
      title='synthetic', tokens=tokens, type='question' if index % 2 else 'answer')


#: What `synthetic_client_data` costs on this project's machine type (time.perf_counter, tracemalloc):
#: about 480 bytes an example (its sentence and fields; the population's file may live in memory, a
#: tmpfs), 0.2 ms a client and 0.18 ms an example, written to its file included (3.7 s for 1000
#: clients of 20, 7.1 s for 200 of 200). The figures below are lower bounds (about two thirds of the
#: times) for `memory.check_generated_clients`.
_GENERATION_COST = (480, 130e-6, 120e-6)


def synthetic_client_data(
    num_clients: int, *, vocab_size: int, examples_per_client: int = 20, seed: int = 0,
    extra_words: float = 0.2,
) -> Tuple[tff.simulation.datasets.ClientData, tf.data.Dataset, List[str]]:
  """A synthetic federated StackOverflow population, a test set and its vocabulary.

  Args:
    num_clients: number of clients.
    vocab_size: V, the vocabulary the model uses; the chain has V * (1 + extra_words) words, so the
      rarest ones are out of vocabulary.
    examples_per_client: mean sentences per client (between half and 1.5 times it).
    seed: the population is a pure function of the arguments.
    extra_words: fraction of additional (out-of-vocabulary) words.

  Returns:
    (train ClientData, test dataset of 500 sentences, vocabulary: the V most frequent words).

  Raises:
    ValueError: naming the argument; a population too large for the memory or for an hour of
      generation (`memory.check_generated_clients`) names `num_clients` and `examples_per_client`.
  """
  num_clients = _validation.check_positive_int(num_clients, 'num_clients')
  vocab_size = _validation.check_positive_int(vocab_size, 'vocab_size')
  examples_per_client = _validation.check_positive_int(examples_per_client, 'examples_per_client')
  seed = _validation.check_nonnegative_int(seed, 'seed')
  memory.check_generated_clients(num_clients, examples_per_client, *_GENERATION_COST)
  extra_words = _validation.check_nonnegative_float(extra_words, 'extra_words')
  num_words = vocab_size + max(1, int(vocab_size * extra_words))
  rng = np.random.default_rng([seed, 0])
  # Each word has 3 successors with probabilities 0.6, 0.25, 0.15; sentences start at a Zipf word.
  successors = rng.integers(0, num_words, size=(num_words, 3))
  start_p = 1.0 / np.arange(1, num_words + 1)
  start_p /= start_p.sum()

  def sentence(r: np.random.Generator) -> List[int]:
    words = [int(r.choice(num_words, p=start_p))]
    for _ in range(int(r.integers(4, 25))):
      words.append(int(successors[words[-1], r.choice(3, p=(0.6, 0.25, 0.15))]))
    return words

  def examples(sentences):
    tokens = [' '.join(f'w{w}' for w in s) for s in sentences]
    rows = [_element(t, i) for i, t in enumerate(tokens)]
    return collections.OrderedDict((k, np.array([r[k] for r in rows])) for k in rows[0])

  counts = np.zeros(num_words, dtype=np.int64)
  width = len(str(num_clients - 1))

  def clients():
    for i in range(num_clients):
      r = np.random.default_rng([seed, 1, i])
      size = int(r.integers(max(1, examples_per_client // 2),
                            examples_per_client + examples_per_client // 2 + 1))
      sentences = [sentence(r) for _ in range(size)]
      for s in sentences:
        np.add.at(counts, s, 1)
      yield f'synthetic_{i:0{width}d}', examples(sentences)

  train = _sql_split(sqlite_population.write_population(clients()), 'train')
  test_rng = np.random.default_rng([seed, 2])
  test = examples([sentence(test_rng) for _ in range(500)])
  order = np.lexsort((np.arange(num_words), -counts))  # by count, ties by word index
  vocab = [f'w{w}' for w in order[:vocab_size]]
  return train, tf.data.Dataset.from_tensor_slices(test), vocab


def _parse_tff_example(serialized: tf.Tensor) -> collections.OrderedDict:
  """Parses one serialized `tf.train.Example` of TFF's StackOverflow SQLite file."""
  spec = {k: tf.io.FixedLenFeature(shape=(), dtype=tf.string) for k in _STRING_FEATURES}
  spec['score'] = tf.io.FixedLenFeature(shape=(), dtype=tf.int64)
  parsed = tf.io.parse_example(serialized, spec)
  return collections.OrderedDict((k, parsed[k]) for k in sorted(spec))


def _sql_split(path: str, split_name: str) -> tff.simulation.datasets.ClientData:
  """The clients of `split_name` in the SQLite file at `path`, in TFF's element format."""
  return tff.simulation.datasets.SqlClientData(path, split_name).preprocess(
      lambda ds: ds.map(_parse_tff_example))


def _vocab_from_word_counts(path: str, vocab_size: int, flag: str) -> List[str]:
  """The first `vocab_size` words of a word-count file (`word count` per line, blank lines
  skipped); a file that is not one is a ValueError naming `flag` and `path`."""
  expected = f'TFF\'s {_WORD_COUNT_NAME} format: `word count` per line, most frequent first'
  words = []
  try:
    with open(path, encoding='utf-8') as f:
      for line_number, line in enumerate(f, start=1):
        fields = line.split()
        if not fields:
          continue
        if len(fields) != 2 or not fields[1].isdigit():
          raise ValueError(f'`{flag}`: line {line_number} of {path} is {line.strip()[:40]!r}; '
                           f'expected {expected}.')
        words.append(fields[0])
        if len(words) == vocab_size:
          break
  except UnicodeDecodeError:
    raise ValueError(f'`{flag}`: {path} is not UTF-8 text; expected {expected}.') from None
  except OSError as error:
    raise ValueError(f'`{flag}`: {path} cannot be read ({error.strerror or error}).') from None
  if not words:
    raise ValueError(f'`{flag}`: {path} holds no words; expected {expected}.')
  return words


def _vocab_from_data(database: str, vocab_size: int, max_clients: int = 1000) -> List[str]:
  """The most frequent words (by number of clients using them, like TFF's word counts) in the train
  split of the first `max_clients` clients."""
  with sqlite3.connect(database) as connection:
    client_ids = [row[0] for row in connection.execute(
        "SELECT client_id FROM client_metadata WHERE split_name = 'train' ORDER BY client_id "
        'LIMIT ?', (max_clients,))]
  data = tff.simulation.datasets.SqlClientData(database, 'train')
  counts = collections.Counter()
  for client_id in client_ids:
    words = set()
    for serialized in data.create_tf_dataset_for_client(client_id):
      words.update(_parse_tff_example(serialized)['tokens'].numpy().decode().split())
    counts.update(words)
  if not counts:
    raise ValueError(f'`data`: the train split of {database} holds no words to count a vocabulary '
                     f'from; give `word_counts`.')
  return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab_size]]


def load_client_data(source: str, *, vocab_size: int, word_counts: Optional[str] = None,
                     ) -> Tuple[tff.simulation.datasets.ClientData, tf.data.Dataset, List[str]]:
  """Real federated StackOverflow: 'tff' (TFF's loader; downloads about 9 GB if not cached), a cache
  directory holding TFF's decompressed `stackoverflow.sqlite`, or the path of such a SQLite file.

  The vocabulary comes from `word_counts` (TFF's `stackoverflow.word_count` format: `word count` per
  line, most frequent first), else from that file beside the SQLite file, else it is counted from the
  train split (first 1000 clients). Paths never trigger a download.

  Returns:
    (train ClientData, test dataset, vocabulary of at most `vocab_size` words).

  Raises:
    ValueError: naming the flag (`data`, `word_counts`) and the path, for a missing file or one that
      is not of its format (`experiments.run.sqlite_data.check_sqlite_file`), or a corrupt cache of
      'tff'.
  """
  vocab_size = _validation.check_positive_int(vocab_size, 'vocab_size')
  if not isinstance(source, str) or not source:
    raise ValueError(f'`source` must be "tff" or a path, got {source!r}.')
  if source == 'tff':
    try:
      train, _, test = tff.simulation.datasets.stackoverflow.load_data()
    except sqlite3.Error as error:
      raise ValueError(f'`data`=tff: TFF\'s cached {_SQLITE_NAME} cannot be read ({error}); delete '
                       'it (in ~/.keras/datasets) to download it again.') from None
    vocab = list(tff.simulation.datasets.stackoverflow.load_word_counts(vocab_size=vocab_size))
    return train, test.create_tf_dataset_from_all_clients(), vocab
  path = os.path.join(source, _SQLITE_NAME) if os.path.isdir(source) else source
  if not os.path.isfile(path):
    raise ValueError(f'`data`: no StackOverflow SQLite file at {path!r} (expected TFF\'s '
                     f'decompressed {_SQLITE_NAME} or a directory holding it).')
  vocab = None
  if word_counts is not None:
    if not os.path.isfile(word_counts):
      raise ValueError(f'`word_counts`: no file at {word_counts!r}.')
    vocab = _vocab_from_word_counts(word_counts, vocab_size, 'word_counts')
  features = {k: ('bytes_list', 1) for k in _STRING_FEATURES}
  features['score'] = ('int64_list', 1)
  sqlite_data.check_sqlite_file(
      path, flag='data', expected=f"TFF's decompressed {_SQLITE_NAME} or a directory holding it",
      splits=('train', 'test'), features=features)
  beside = os.path.join(os.path.dirname(path), _WORD_COUNT_NAME)
  if vocab is None and os.path.isfile(beside):
    vocab = _vocab_from_word_counts(beside, vocab_size, 'data')
  elif vocab is None:
    vocab = _vocab_from_data(path, vocab_size)

  return (_sql_split(path, 'train'), _sql_split(path, 'test').create_tf_dataset_from_all_clients(),
          vocab)


def preprocess_fn(vocab: List[str], sequence_length: int, batch_size: int, num_epochs: int,
                  max_elements: Optional[int] = None, shuffle_seed: int = 0, shuffle: bool = True):
  """Maps raw elements to `OrderedDict(x=int64[B, L], y=int64[B, L])` next-word batches.

  The shuffle is seeded (a client's batches are a pure function of its data); `shuffle=False` keeps
  the data order, for the test set (a seeded shuffle reshuffles on every iteration, so a truncated
  evaluation would depend on how often the dataset was iterated before, e.g. differ after a resume).

  A sentence becomes [bos] + ids(tokens[:L]) + [eos], truncated and padded (with 0) to L + 1 ids;
  x is ids[:-1] and y is ids[1:]. Words outside `vocab` map to the OOV id.
  """
  if not vocab:
    raise ValueError('`vocab` must not be empty.')
  sequence_length = _validation.check_positive_int(sequence_length, 'sequence_length')
  batch_size = _validation.check_positive_int(batch_size, 'batch_size')
  num_epochs = _validation.check_positive_int(num_epochs, 'num_epochs')
  if max_elements is not None:
    _validation.check_positive_int(max_elements, 'max_elements')
  ids = special_tokens(len(vocab))
  vocab = list(vocab)

  def to_xy(element):
    table = tf.lookup.StaticHashTable(  # built per trace: datasets are traced inside TFF
        tf.lookup.KeyValueTensorInitializer(vocab, tf.range(1, len(vocab) + 1, dtype=tf.int64)),
        default_value=ids['oov'])
    words = tf.strings.split(element['tokens'])[:sequence_length]
    tokens = tf.concat([[ids['bos']], table.lookup(words), [ids['eos']]], axis=0)[
        :sequence_length + 1]
    tokens = tf.pad(tokens, [[0, sequence_length + 1 - tf.shape(tokens)[0]]])
    tokens = tf.reshape(tokens, [sequence_length + 1])
    return collections.OrderedDict(x=tokens[:-1], y=tokens[1:])

  def preprocess(dataset: tf.data.Dataset) -> tf.data.Dataset:
    if max_elements is not None:
      dataset = dataset.take(max_elements)
    dataset = dataset.map(to_xy)
    if shuffle:
      dataset = dataset.shuffle(128, seed=shuffle_seed)
    return dataset.repeat(num_epochs).batch(batch_size)

  return preprocess
