"""The StackOverflow real-data path, offline, on a small SQLite file written by hand in TFF's schema."""

import collections
import os
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff.training import training_loop
from experiments.stackoverflow import data as so_data
from experiments.stackoverflow import run_stackoverflow
from tests.testing import runs

pytestmark = pytest.mark.unit

SENTENCES = ['how do i sort a list', 'sort the list in place', 'a list of words',
             'how to read a file', 'read the file line by line', 'zebra']


def _example(tokens: str) -> bytes:
  def b(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
  features = {'creation_date': b('2017-05-01 00:00:00 UTC'), 'tags': b('python|list'),
              'title': b('a title'), 'tokens': b(tokens), 'type': b('question'),
              'score': tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}
  return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


@pytest.fixture(scope='module')
def database(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('so') / 'stackoverflow.sqlite')
  with sqlite3.connect(path) as con:
    con.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
                'serialized_example_proto BLOB NOT NULL)')
    con.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, '
                'num_examples INTEGER NOT NULL)')
    for split, num_clients in (('train', 12), ('test', 3)):
      for c in range(num_clients):
        client_id = f'{split}_{c:03d}'
        rows = [SENTENCES[(c + j) % 5] for j in range(3)]
        con.executemany('INSERT INTO examples VALUES (?, ?, ?)',
                        [(split, client_id, _example(s)) for s in rows])
        con.execute('INSERT INTO client_metadata VALUES (?, ?, ?)', (client_id, split, len(rows)))
  return path


def test_parses_tff_format_and_counts_vocabulary(database):
  train, test, vocab = so_data.load_client_data(database, vocab_size=5)
  assert len(train.client_ids) == 12
  element = next(iter(train.create_tf_dataset_for_client('train_000')))
  assert list(element) == ['creation_date', 'score', 'tags', 'title', 'tokens', 'type']
  assert element['tokens'].numpy().decode() == SENTENCES[0]
  assert int(element['score']) == 3
  # Counted by number of clients using the word, ties alphabetical.
  counts = collections.Counter()
  for c in range(12):
    counts.update(set(' '.join(SENTENCES[(c + j) % 5] for j in range(3)).split()))
  expected = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
  assert vocab == expected
  assert sum(1 for _ in test) == 9


def test_word_count_file_beside_the_database_is_used(database, tmp_path):
  local = tmp_path / 'stackoverflow.sqlite'
  local.write_bytes(open(database, 'rb').read())
  (tmp_path / 'stackoverflow.word_count').write_text('the 10\nfile 7\nzebra 1\n')
  _, _, vocab = so_data.load_client_data(str(tmp_path), vocab_size=2)
  assert vocab == ['the', 'file']


def test_preprocess_ids_match_hand_computation():
  vocab = ['how', 'do', 'i']
  ids = so_data.special_tokens(3)
  preprocess = so_data.preprocess_fn(vocab, sequence_length=4, batch_size=1, num_epochs=1)
  dataset = tf.data.Dataset.from_tensor_slices({'tokens': ['how do x i j k']})
  batch = next(iter(preprocess(dataset)))
  # [bos, how, do, oov, i] -> x = first 4, y = last 4 (eos truncated away).
  np.testing.assert_array_equal(batch['x'][0], [ids['bos'], 1, 2, ids['oov']])
  np.testing.assert_array_equal(batch['y'][0], [1, 2, ids['oov'], 3])
  short = next(iter(preprocess(tf.data.Dataset.from_tensor_slices({'tokens': ['do']}))))
  np.testing.assert_array_equal(short['x'][0], [ids['bos'], 2, ids['eos'], 0])
  np.testing.assert_array_equal(short['y'][0], [2, ids['eos'], 0, 0])


@pytest.mark.integration
def test_driver_runs_on_the_sqlite_file(database, tmp_path):
  config = runs.tiny_config(
      tmp_path, data=database, clients_per_round=3, min_sep=2, rounds=2,
      task={'vocab_size': 8, 'embedding_size': 4, 'lstm_size': 4, 'sequence_length': 5,
            'max_elements_per_client': 8, 'word_counts': None})
  result = training_loop.train(run_stackoverflow.build_task(config), config, config.output_dir)
  assert np.isfinite(result['metrics']['train_loss'])
  history = runs.read_log(os.path.join(config.output_dir, 'participation.csv'))
  assert set(history) <= {f'train_{c:03d}' for c in range(12)}


def test_missing_file_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match='no StackOverflow SQLite file'):
    so_data.load_client_data(str(tmp_path), vocab_size=5)


def test_a_file_of_another_dataset_or_truncated_names_data_and_the_path(database, tmp_path):
  """The loaders check the file before TFF reads it: each problem is a ValueError naming `data`
  (or `word_counts`) and the path."""
  from experiments.emnist import data as emnist_data  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"`data`: .*has no clients of the split 'digits_only_train'"):
    emnist_data.load_client_data(database)
  with sqlite3.connect(tmp_path / 'emnist.sqlite') as con:  # TFF's tables, StackOverflow examples
    con.execute('CREATE TABLE examples (split_name, client_id, serialized_example_proto)')
    con.execute('CREATE TABLE client_metadata (client_id, split_name, num_examples)')
    for split in ('digits_only_train', 'digits_only_test'):
      con.execute('INSERT INTO examples VALUES (?, ?, ?)', (split, 'c', _example('a b')))
      con.execute('INSERT INTO client_metadata VALUES (?, ?, ?)', ('c', split, 1))
  con.close()
  with pytest.raises(ValueError, match=r"emnist.sqlite holds examples without the feature 'pixels'"):
    emnist_data.load_client_data(str(tmp_path / 'emnist.sqlite'))
  truncated = tmp_path / 'stackoverflow.sqlite'
  truncated.write_bytes(open(database, 'rb').read()[:5000])
  with pytest.raises(ValueError, match=f'`data`: {truncated} is truncated'):
    so_data.load_client_data(str(tmp_path), vocab_size=5)
  bad_counts = tmp_path / 'counts.txt'
  bad_counts.write_text('the 10\n\nfile seven\n')
  with pytest.raises(ValueError, match=f'`word_counts`: line 3 of {bad_counts}'):
    so_data.load_client_data(database, vocab_size=5, word_counts=str(bad_counts))
