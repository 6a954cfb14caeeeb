"""The central evaluation of a run's model (`Task.evaluate_fn`, or Keras `evaluate` on
`Task.eval_dataset`), for the drivers and a user's own loop alike."""

from typing import Dict

from dp_ftrl_tff.training.task import Task


def evaluate(task: Task, weights, max_examples: int) -> Dict[str, float]:
  """`eval_<metric>` of the model with `weights` (`tff.learning.models.ModelWeights`):
  `task.evaluate_fn(weights)`, or Keras `evaluate` on up to `max_examples` examples of
  `task.eval_dataset`, in batches of 256."""
  if not isinstance(max_examples, int) or max_examples < 1:
    raise ValueError(f'`max_examples` must be a positive integer, got {max_examples!r}.')
  if task.evaluate_fn is not None:
    return {f'eval_{k}': float(v) for k, v in task.evaluate_fn(weights).items()}
  model = task.keras_model_fn()
  weights.assign_weights_to(model)
  dataset = (task.eval_dataset.unbatch().take(max_examples).batch(256)
             .map(lambda batch: (batch['x'], batch['y'])))
  return {f'eval_{k}': float(v) for k, v in model.evaluate(dataset, verbose=0,
                                                             return_dict=True).items()}
