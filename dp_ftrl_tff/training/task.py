"""A training run's task (`Task`): the user's model, training population, client preprocessing and
evaluation; everything else of a run is its `run_config.RunConfig`.

Any TFF model and `tff.simulation.datasets.ClientData` (in memory, `SqlClientData`, a file-backed
one of one's own) make a task: `dp_ftrl_tff.training.train(task, config, output_dir)` trains it with
every safeguard of the drivers, whose EMNIST and StackOverflow tasks are built the same way
(`experiments/emnist/run_emnist.py`, `experiments/stackoverflow/run_stackoverflow.py`).
"""

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

if TYPE_CHECKING:  # the binaries check their flags before TensorFlow is imported
  import tensorflow as tf


@dataclasses.dataclass
class Task:
  """What a run trains and evaluates.

  Attributes:
    train_data: the federated training population (`tff.simulation.datasets.ClientData`; its
      `client_ids` are the population the sampler draws from, in their order).
    model_fn: no-argument constructor of the TFF model to train (`tff.learning.models`).
    client_preprocess_fn: maps a client's raw dataset to its training batches (the model's input
      spec: `OrderedDict(x=, y=)` batches).
    keras_model_fn: no-argument constructor of the same model as a compiled Keras model, for the
      central evaluation of `eval_dataset` (Keras `evaluate`'s metrics); give both or
      `evaluate_fn`.
    eval_dataset: central test batches (already preprocessed, elements `OrderedDict(x=, y=)`).
    evaluate_fn: instead of the Keras evaluation: `tff.learning.models.ModelWeights` ->
      {metric name: float}.
    accuracy_metric: the training metric printed as "accuracy" in the round lines.
    name: the population's name in the run's header (e.g. the data format).
  """
  train_data: Any
  model_fn: Callable[[], Any]
  client_preprocess_fn: Callable[['tf.data.Dataset'], 'tf.data.Dataset']
  keras_model_fn: Optional[Callable[[], Any]] = None
  eval_dataset: Optional['tf.data.Dataset'] = None
  evaluate_fn: Optional[Callable[[Any], Dict[str, float]]] = None
  accuracy_metric: str = 'accuracy'
  name: str = 'training data'

  def __post_init__(self):
    for field in ('model_fn', 'client_preprocess_fn'):
      if not callable(getattr(self, field)):
        raise ValueError(f'`{field}` must be callable, got {getattr(self, field)!r}.')
    if not (hasattr(self.train_data, 'client_ids') and
            hasattr(self.train_data, 'create_tf_dataset_for_client')):
      raise ValueError('`train_data` must be a tff.simulation.datasets.ClientData, got '
                       f'{type(self.train_data).__name__}.')
    keras = (self.keras_model_fn, self.eval_dataset)
    if self.evaluate_fn is not None:
      if any(part is not None for part in keras):
        raise ValueError('`evaluate_fn` excludes `keras_model_fn` and `eval_dataset`: give one '
                         'evaluation.')
      if not callable(self.evaluate_fn):
        raise ValueError(f'`evaluate_fn` must be callable, got {self.evaluate_fn!r}.')
    elif any(part is None for part in keras):
      raise ValueError('a task needs an evaluation: `keras_model_fn` and `eval_dataset`, or '
                       '`evaluate_fn`.')
    elif not callable(self.keras_model_fn):
      raise ValueError(f'`keras_model_fn` must be callable, got {self.keras_model_fn!r}.')
    if not isinstance(self.accuracy_metric, str) or not self.accuracy_metric:
      raise ValueError(f'`accuracy_metric` must be a metric name, got {self.accuracy_metric!r}.')
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f'`name` must be a non-empty string, got {self.name!r}.')
