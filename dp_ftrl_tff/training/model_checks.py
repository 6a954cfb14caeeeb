"""The checks of a task's model against its data, before any TFF computation is built: a model whose
outputs do not fit the labels fails inside TFF's executor with a long gRPC error otherwise."""

import numpy as np
import tensorflow as tf

from dp_ftrl_tff.training.task import Task


def check_model_fits_data(task: Task) -> int:
  """Runs the task's model forward (no training) on the first batch of its first client's
  preprocessed data; returns the model's trainable parameters (the size of a model update, hence
  of the noise), counted on the same model.

  Raises:
    ValueError: one line naming the model function and the batch's element spec, with the first
      line of TensorFlow's error.
  """
  client_ids = list(task.train_data.client_ids)
  if not client_ids:
    raise ValueError('`train_data` has no clients.')
  dataset = task.client_preprocess_fn(
      task.train_data.create_tf_dataset_for_client(client_ids[0]))
  model_name = getattr(task.model_fn, '__qualname__', repr(task.model_fn))
  model = task.model_fn()
  try:
    batch = next(iter(dataset.take(1)), None)
    if batch is not None:  # an empty first client: nothing to check it on
      model.forward_pass(batch, training=False)
  except (ValueError, TypeError, tf.errors.OpError) as error:
    first = next((line.strip() for line in str(error).splitlines() if line.strip()),
                 type(error).__name__)
    raise ValueError(
        f'the task\'s model (`model_fn` {model_name}) does not fit its data: a batch of client '
        f'{client_ids[0]!r} (element spec {dataset.element_spec}) fails its forward pass: '
        f'{first}') from error
  return sum(int(np.prod(variable.shape)) for variable in model.trainable_variables)
