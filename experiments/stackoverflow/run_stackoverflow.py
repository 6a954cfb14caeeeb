r"""StackOverflow DP-FTRL driver: next-word prediction trained with DP-FTRL and min-sep sampling.

Model (BandMF / BLT papers, after Reddi et al. 2021): vocabulary 10000, embedding 96, one LSTM layer
of 670 units, sequences of 20 tokens, accuracy with and without OOV / EOS. Data: a synthetic
population, TFF's loader, or an offline cache directory / SQLite file in TFF's format.

Example (synthetic clients, a few minutes on 2 cores; run from the repository root):
  python -m experiments.stackoverflow.run_stackoverflow \
      --flagfile=configs/stackoverflow_blt_synthetic.cfg --root_output_dir=/tmp/runs

"""

import os

# Quiet console: TensorFlow's C++ logs (cuDNN/cuFFT registration, grappler, ...) off unless the
# user set TF_CPP_MIN_LOG_LEVEL (it must be set before TensorFlow is imported).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
if __name__ == '__main__':  # SIGINT / SIGTERM recorded from the start (dp_ftrl_tff.training.stop_signals)
  from dp_ftrl_tff.training import stop_signals as _stop_signals
  _stop_signals.record_early()

from absl import flags  # noqa: E402

from dp_ftrl_tff import _validation  # noqa: E402
from dp_ftrl_tff.mechanisms import memory  # noqa: E402
from dp_ftrl_tff.training import task as task_lib
from experiments.run import driver, driver_config, driver_flags

FLAGS = flags.FlagValues()
driver_flags.define_common_flags(FLAGS)
flags.DEFINE_integer('vocab_size', 10000, 'Vocabulary size V (words).', flag_values=FLAGS)
flags.DEFINE_integer('embedding_size', 96, 'Word embedding size.', flag_values=FLAGS)
flags.DEFINE_integer('lstm_size', 670, 'LSTM units.', flag_values=FLAGS)
flags.DEFINE_integer('sequence_length', 20, 'Tokens per sequence.', flag_values=FLAGS)
flags.DEFINE_integer('max_elements_per_client', 256, 'Sentences used per client and round.',
                     flag_values=FLAGS)
flags.DEFINE_string('word_counts', None, 'Vocabulary file in TFF\'s stackoverflow.word_count format.',
                    flag_values=FLAGS)
TASK_FLAGS = ('vocab_size', 'embedding_size', 'lstm_size', 'sequence_length',
              'max_elements_per_client', 'word_counts')


def build_task(config: driver_config.DriverConfig) -> task_lib.Task:
  """The StackOverflow task described by `config` (model sizes in its `task` dict)."""
  # TensorFlow comes with the data and models: imported once the flags are checked.
  from experiments.stackoverflow import data as so_data  # pylint: disable=g-import-not-at-top
  from experiments.stackoverflow import models as so_models  # pylint: disable=g-import-not-at-top
  settings = config.task
  vocab_size = settings['vocab_size']
  if config.data == 'synthetic':
    train, test, vocab = so_data.synthetic_client_data(
        config.synthetic_num_clients, vocab_size=vocab_size,
        examples_per_client=config.synthetic_examples_per_client, seed=config.seed)
  else:
    train, test, vocab = so_data.load_client_data(config.data, vocab_size=vocab_size,
                                                  word_counts=settings['word_counts'])
  vocab_size = len(vocab)  # a small dataset can have fewer distinct words than asked
  sizes = (vocab_size, settings['embedding_size'], settings['lstm_size'])
  preprocess = so_data.preprocess_fn(vocab, settings['sequence_length'], config.client_batch_size,
                                     config.client_epochs, settings['max_elements_per_client'],
                                     shuffle_seed=config.seed)

  def keras_model_fn():
    model = so_models.build_keras_model(*sizes, seed=config.seed)
    model.compile(loss=so_models.loss_fn(), metrics=so_models.metrics_fn(vocab_size))
    return model

  return task_lib.Task(
      name=config.data,
      train_data=train,
      model_fn=so_models.tff_model_fn(*sizes, settings['sequence_length'], seed=config.seed),
      keras_model_fn=keras_model_fn,
      client_preprocess_fn=preprocess,
      eval_dataset=so_data.preprocess_fn(vocab, settings['sequence_length'], 256, 1,
                                          shuffle=False)(test),  # fixed order (resume)
      accuracy_metric='accuracy_no_oov_or_eos')


def model_parameters(vocab_size: int, embedding_size: int, lstm_size: int) -> int:
  """The parameters of `models.build_keras_model`: the embedding of V + 4 ids, the LSTM (kernel,
  recurrent kernel and bias of 4 gates), the projection and the logits (4,050,748 at the papers'
  sizes)."""
  v, e, h = (_validation.check_positive_int(value, name) + extra for value, name, extra in (
      (vocab_size, 'vocab_size', 4), (embedding_size, 'embedding_size', 0),
      (lstm_size, 'lstm_size', 0)))
  return v * e + 4 * (e + h + 1) * h + (h * e + e) + (e * v + v)


def task_settings(fv: flags.FlagValues) -> dict:
  """The driver's own settings (`DriverConfig.task`) from its parsed flags; a model or a batch of
  sequences too large for the memory is a `memory.MemoryLimitError` naming its flags, before
  TensorFlow builds it."""
  if fv.word_counts is not None and not os.path.isfile(fv.word_counts):
    raise ValueError(f'`word_counts`: no file at {fv.word_counts!r}.')
  settings = {name: fv[name].value for name in TASK_FLAGS}
  sizes = [_validation.check_positive_int(settings[name], name)
           for name in ('vocab_size', 'embedding_size', 'lstm_size', 'sequence_length')]
  vocab, embedding, lstm, length = sizes
  batch = _validation.check_positive_int(fv.client_batch_size, 'client_batch_size')
  memory.check_model_fits(
      model_parameters(vocab, embedding, lstm),
      f'`vocab_size`={vocab}, `embedding_size`={embedding}, `lstm_size`={lstm}, '
      f'`sequence_length`={length} and `client_batch_size`={batch}',
      # Per token of a batch: the logits, the LSTM's gates and the embedding, at least.
      activation_floats=batch * length * (vocab + 4 + 4 * lstm + embedding))
  return settings


if __name__ == '__main__':
  driver.run_main(FLAGS, build_task, task_settings, __doc__)
