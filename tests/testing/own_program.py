"""A user's own program for the tests: the population of experiments/tabular/task.py in a SQLite file
written by TFF's own `save_to_sql_client_data` and read through TFF's `SqlClientData`, an MLP of
one's own, trained with canaries, a restart and evaluations, either by
`dp_ftrl_tff.training.train` (`--mode=train`) or by the user's own
`tff.learning.programs.train_model` call with the parts of `training_loop.run_program`
(`--mode=own`).

  python -m tests.testing.own_program --mode=own --root_output_dir=ROOT --experiment_name=NAME
"""

import asyncio
import sys

ROUNDS = 5


def task_and_config(data_dir: str):
  """The task and settings every mode trains; the population file is `data_dir`/clients.sqlite
  (written first if missing)."""
  import os  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from dp_ftrl_tff import training  # pylint: disable=g-import-not-at-top
  from experiments.tabular import task as tabular  # pylint: disable=g-import-not-at-top

  clients, test = tabular.population(60, 10, seed=1)
  path = os.path.join(data_dir, 'clients.sqlite')
  if not os.path.exists(path):
    tabular.write_population(path, 60, 10, seed=1)
  train_data = tff.simulation.datasets.load_and_parse_sql_client_data(path, tabular.ELEMENT_SPEC)

  def preprocess(dataset):
    return dataset.batch(5)

  spec = preprocess(tf.data.Dataset.from_tensor_slices(test)).element_spec
  loss = lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)  # noqa: E731

  def model_fn():
    return tff.learning.models.from_keras_model(tabular.keras_model(1), loss=loss(),
                                                input_spec=spec)

  def evaluate_fn(weights):
    model = tabular.keras_model(1)
    model.compile(loss=loss())
    weights.assign_weights_to(model)
    return {'loss': model.evaluate(tf.data.Dataset.from_tensor_slices(
        (test['x'], test['y'])).batch(100), verbose=0)}

  task = training.Task(train_data=train_data,
                       model_fn=model_fn, client_preprocess_fn=preprocess,
                       evaluate_fn=evaluate_fn, accuracy_metric='loss')
  config = training.RunConfig(
      rounds=ROUNDS, mechanism='blt', mechanism_options={'num_buffers': 1}, noise_multiplier=0.5,
      clients_per_round=5, min_sep=2, restart_rounds=(3,), canary_clients=20, seed=1,
      noise_seed=3, checkpoint_every=1, eval_every=2)
  return task, config


def main(argv) -> int:
  options = dict(arg[2:].split('=', 1) for arg in argv[1:])
  import os  # pylint: disable=g-import-not-at-top

  from dp_ftrl_tff import training  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff.training import training_loop  # pylint: disable=g-import-not-at-top
  task, config = task_and_config(options['root_output_dir'])
  output_dir = os.path.join(options['root_output_dir'], options['experiment_name'])
  if options['mode'] == 'train':
    training.train(task, config, output_dir)
    return 0
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  with training_loop.run_program(task, config, output_dir) as program:
    asyncio.run(tff.learning.programs.train_model(**program.train_model_args))
    program.finish()
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
