r"""EMNIST DP-FTRL driver: trains an EMNIST model with DP-FTRL and min-sep client sampling.

Model: the FedAvg CNN (or --model=tiny); data: a synthetic population, TFF's loader, or an offline
cache / SQLite file. A run writes metrics, checkpoints, the participation log and its privacy report
into --root_output_dir/--experiment_name.

Example (synthetic clients, a few minutes on 2 cores; run from the repository root):
  python -m experiments.emnist.run_emnist --flagfile=configs/emnist_blt_synthetic.cfg \
      --root_output_dir=/tmp/runs

"""

import os

# Quiet console: TensorFlow's C++ logs (cuDNN/cuFFT registration, grappler, ...) off unless the
# user set TF_CPP_MIN_LOG_LEVEL (it must be set before TensorFlow is imported).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
if __name__ == '__main__':  # SIGINT / SIGTERM recorded from the start (dp_ftrl_tff.training.stop_signals)
  from dp_ftrl_tff.training import stop_signals as _stop_signals
  _stop_signals.record_early()

from absl import flags  # noqa: E402

from dp_ftrl_tff.training import task as task_lib
from experiments.emnist import MODELS  # noqa: E402
from experiments.run import driver, driver_config, driver_flags

FLAGS = flags.FlagValues()
driver_flags.define_common_flags(FLAGS)
flags.DEFINE_enum('model', 'fedavg_cnn', MODELS, 'EMNIST model.', flag_values=FLAGS)
flags.DEFINE_bool('only_digits', True, '10 digit classes (else 62 classes).', flag_values=FLAGS)


def build_task(config: driver_config.DriverConfig) -> task_lib.Task:
  """The EMNIST task described by `config` (its `task` dict holds `model` and `only_digits`)."""
  # TensorFlow comes with the data and models: imported once the flags are checked.
  from experiments.emnist import data as emnist_data  # pylint: disable=g-import-not-at-top
  from experiments.emnist import models as emnist_models  # pylint: disable=g-import-not-at-top
  num_classes = 10 if config.task['only_digits'] else 62
  if config.data == 'synthetic':
    train, test = emnist_data.synthetic_client_data(
        config.synthetic_num_clients, examples_per_client=config.synthetic_examples_per_client,
        num_classes=num_classes, seed=config.seed)
  else:
    train, test = emnist_data.load_client_data(config.data, only_digits=config.task['only_digits'])
  preprocess = emnist_data.preprocess_fn(config.client_batch_size, config.client_epochs,
                                         shuffle_seed=config.seed)
  eval_dataset = emnist_data.preprocess_fn(256, 1, shuffle=False)(test)  # fixed order
  model_name = config.task['model']

  def keras_model_fn():
    model = emnist_models.build_keras_model(model_name, num_classes, config.seed)
    model.compile(loss=emnist_models.loss_fn(), metrics=emnist_models.metrics_fn())
    return model

  return task_lib.Task(
      name=config.data,
      train_data=train,
      model_fn=emnist_models.tff_model_fn(model_name, num_classes, config.seed),
      keras_model_fn=keras_model_fn,
      client_preprocess_fn=preprocess,
      eval_dataset=eval_dataset,
      accuracy_metric='accuracy')


def task_settings(fv: flags.FlagValues) -> dict:
  """The driver's own settings (`DriverConfig.task`) from its parsed flags."""
  return {'model': fv.model, 'only_digits': fv.only_digits}


if __name__ == '__main__':
  driver.run_main(FLAGS, build_task, task_settings, __doc__)
