"""The training loop's evaluation every --eval_every rounds, through TFF's EvaluationManager.

`tff.learning.programs.train_model` hands the model weights of every `evaluation_periodicity`-th
round and of the last one to its `evaluation_manager` (`start_evaluation`, awaited in its main loop
before the round's save and releases start), which evaluates them in a background task concurrent
with training and releases the result, keyed by the 1-based round, to its
`aggregated_metrics_manager`. Here (`evaluation_manager`):

  * the evaluation is the drivers' own (`dp_ftrl_tff.training.evaluation.evaluate`: Keras
    `model.evaluate` on up to `eval_max_examples` test examples), so the values are the drivers'
    exactly. A TFF computation cannot call Keras's `evaluate` loop (a computation is a traced graph;
    `tff.learning.algorithms.build_fed_eval` computes the metrics with its own graph and names), so
    the process EvaluationManager runs (`KerasEvaluation`) is a Python object with the three methods
    EvaluationManager calls (`initialize`, `set_model_weights`, `next`, returning a
    `LearningProcessOutput`), not a `tff.learning.templates.LearningProcess`; it runs one round
    (`duration` 0), on the test set it reads itself (`CentralTestSet`);
  * `Evaluations`, the aggregated-metrics manager, holds each round's `eval_<metric>` until the
    round's metrics row takes it (`EvaluatedRows`, inside `RoundMetricsReleaseManager`'s ordered
    releases; a row waits only for an evaluation `start_evaluation` began, which train_model awaits
    before it starts the round's release, so the rule of which rounds are evaluated stays
    train_model's): the evaluation lands in THAT round's row (0-based key), as in the drivers,
    with no late rewrite of metrics.csv (`CSVFileReleaseManager.release` drops the rows at and
    after its key). The round's checkpoint waits for its row (`state_manager.StateManager`), so
    it waits for its evaluation too;
  * EvaluationManager's state managers (its list of evaluations in flight, each evaluation's model)
    live in `checkpoints/eval/` and are removed at each start (`clear`): a checkpoint of round r is
    saved only after the evaluations of rounds <= r ended, and train_model redoes the rounds after
    the checkpoint it resumes from, their evaluations with them, so nothing in flight is resumed
    (resuming them would evaluate a round twice, and the second `start_evaluation` of a round would
    find its version 0 saved: `ProgramStateExistsError`).

An error of an evaluation (or of its state managers: a full disk) is recorded in the run's
`RoundsReleased` (the loop raises it before the next round, as one line), and ends the waits.
"""

import datetime
import os
import shutil
from typing import Callable, Dict

import tensorflow_federated as tff

from dp_ftrl_tff.training import checkpoint_records

#: EvaluationManager's state managers' directory, under the run's checkpoints/.
EVAL_DIR = 'eval'
#: The prefix of their versions (not the training checkpoints' `program_state_`).
EVAL_PREFIX = 'eval_state_'


def eval_dir(output_dir: str) -> str:
  return os.path.join(checkpoint_records.checkpoints_dir(output_dir), EVAL_DIR)


def clear(output_dir: str) -> None:
  """Removes the EvaluationManager state of an earlier start of the run (see the module
  docstring)."""
  if os.path.isdir(eval_dir(output_dir)):
    shutil.rmtree(eval_dir(output_dir))


def as_model_weights(value) -> tff.learning.models.ModelWeights:
  """`value` (materialized weights of `process.get_model_weights`) as `ModelWeights`."""
  if isinstance(value, tff.learning.models.ModelWeights):
    return value
  return tff.learning.models.ModelWeights(trainable=list(value[0]),
                                          non_trainable=list(value[1]))


class Evaluations(tff.program.ReleaseManager):
  """The `aggregated_metrics_manager` of the run's EvaluationManager: keeps the `eval_<metric>`
  of each evaluated round (train_model's 1-based key) until `take` hands them to the round's row.
  `released` (`release_order.RoundsReleased`) ends the waits on a failure."""

  def __init__(self, released):
    self._released, self._started, self._results = released, set(), {}

  @property
  def failure(self):
    """The run's first failure (of a release, a save or an evaluation), or None."""
    return self._released.failure

  def started(self, key: int) -> None:
    """Round `key`'s evaluation started: its row waits for it."""
    self._started.add(int(key))

  async def release(self, value, key):
    metrics = tff.program.structure_utils.flatten_with_name(value['model_metrics'])
    self._results[int(key)] = {name: float(v) for name, v in metrics}
    self._released.mark(('eval', int(key)))

  async def take(self, key: int) -> Dict[str, float]:
    """The evaluation of round `key` (1-based), once released; {} for a round not evaluated.

    Raises:
      the run's first failure, when one ended the wait before the evaluation was released.
    """
    key = int(key)
    if key not in self._started:
      return {}
    await self._released.wait(('eval', key))
    self._started.discard(key)
    if key not in self._results:
      raise self._released.failure
    return self._results.pop(key)


class EvaluatedRows(tff.program.ReleaseManager):
  """Releases each metrics row (0-based key) with its round's evaluation added
  (`Evaluations.take(key + 1)`) to each of `managers` in turn. Put it in
  `metrics_release.RoundMetricsReleaseManager`'s `managers`: its releases run one at a time in
  round order, so a row waiting for its evaluation holds the later rows back; after a failure
  (a failed evaluation, release or save) no row is written."""

  def __init__(self, managers, evaluations: Evaluations):
    self._managers, self._evaluations = tuple(managers), evaluations

  async def release(self, value, key):
    row = {**value, **await self._evaluations.take(int(key) + 1)}
    if self._evaluations.failure is not None:  # no row after a failure: the rerun writes it
      raise self._evaluations.failure
    for manager in self._managers:
      await manager.release(row, key=key)


class CentralTestSet:
  """EvaluationManager's `data_source`: it only calls `iterator().select(cohort_size)`. The
  evaluation reads the task's test set itself (`KerasEvaluation`), so `select` gives None."""

  def iterator(self):
    return self

  def select(self, num_clients):
    del num_clients
    return None


class KerasEvaluation:
  """The evaluation process EvaluationManager runs (see the module docstring): its state is the
  model weights to evaluate; `next` returns them with `evaluate(weights)` (the drivers' metrics,
  `eval_<metric>`) as both the round's and the total metrics of `client_work/eval`.

  Args:
    evaluate: `ModelWeights` -> {'eval_<metric>': float}.
    template: the materialized `process.get_model_weights(initial_state)`: the structure a saved
      state is loaded into.
    fail: records an error of `evaluate` (`RoundsReleased.fail`) before it is raised.
  """

  def __init__(self, evaluate: Callable, template, fail: Callable):
    self._evaluate, self._template, self._fail = evaluate, template, fail

  def initialize(self):
    return self._template

  def set_model_weights(self, state, model_weights):
    del state
    return model_weights  # train_model's `get_model_weights` reference: EvaluationManager
    # materializes it, then saves it as the evaluation's version 0

  def next(self, state, data):
    del data
    try:
      metrics = self._evaluate(as_model_weights(state))
    except Exception as error:  # noqa: BLE001 (re-raised)
      self._fail(error)
      raise
    eval_metrics = {'current_round_metrics': metrics, 'total_rounds_metrics': metrics}
    return tff.learning.templates.LearningProcessOutput(
        state, {'client_work': {'eval': eval_metrics}})


class _RecordingStateManager(tff.program.FileProgramStateManager):
  """A `FileProgramStateManager` (versions `eval_state_<v>`) whose errors are recorded (`fail`)
  before they are raised: EvaluationManager's tasks would only log them."""

  def __init__(self, root_dir, fail, **kwargs):
    super().__init__(root_dir, prefix=EVAL_PREFIX, **kwargs)
    self._root, self._fail = root_dir, fail

  async def _recorded(self, coroutine):
    try:
      return await coroutine
    except Exception as error:  # noqa: BLE001 (re-raised)
      self._fail(error)
      raise

  async def load(self, version, structure):
    return await self._recorded(super().load(version, structure))

  async def save(self, program_state, version):
    return await self._recorded(super().save(program_state, version))

  async def remove_all(self):
    """Removes every version, then the (empty) directory: EvaluationManager calls it when an
    evaluation ended."""
    await self._recorded(super().remove_all())
    try:
      os.rmdir(self._root)
    except OSError as error:
      self._fail(error)
      raise


class _Manager(tff.learning.programs.EvaluationManager):
  """TFF's EvaluationManager that tells `evaluations` which rounds it evaluates (train_model calls
  `start_evaluation` before it starts the round's metrics release)."""

  def __init__(self, evaluations: Evaluations, **kwargs):
    super().__init__(**kwargs)
    self._evaluations = evaluations

  async def start_evaluation(self, train_round, start_timestamp_seconds, model_weights):
    self._evaluations.started(train_round)
    await super().start_evaluation(train_round, start_timestamp_seconds, model_weights)


def evaluation_manager(output_dir: str, evaluate: Callable, template, evaluations: Evaluations,
                       released) -> tff.learning.programs.EvaluationManager:
  """The run's EvaluationManager (see the module docstring): `evaluate` (`ModelWeights` ->
  metrics) of the weights of each evaluated round, released to `evaluations`; its state in
  `checkpoints/eval/` of `output_dir` (`clear` it before train_model starts)."""
  root = eval_dir(output_dir)

  def state_manager(name: str):
    # EvaluationManager's own list of evaluations in flight takes a version per change: 2 kept.
    return _RecordingStateManager(os.path.join(root, name), released.fail, keep_total=2)

  return _Manager(
      evaluations, data_source=CentralTestSet(), aggregated_metrics_manager=evaluations,
      create_state_manager_fn=state_manager,
      create_process_fn=lambda name: (KerasEvaluation(evaluate, template, released.fail), None),
      cohort_size=1, duration=datetime.timedelta(0))
