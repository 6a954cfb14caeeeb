"""The training loop's managers: checkpoints with their records, and the metrics releases.

`Managers(config, plan, accuracy_metric, run_id, source, canaries)` holds what
`tff.learning.programs.train_model` is given for a run (`dp_ftrl_tff.training.training_loop`): the
program state manager (checkpoints/program_state_<r> every `checkpoint_every` rounds, each followed
by its record, `dp_ftrl_tff.training.checkpoint_records`; a loaded checkpoint's data iterator continues
with the run's data source) and the metrics release (the rows of metrics.csv and tensorboard/, each
with its round's evaluation when there is one and its `round_seconds`, the console lines, then the
privacy report or the canary rows: `programs.metrics_release`, `program_evaluation`,
`programs.report_release`, `CanaryRounds`).

train_model starts a round's save, its releases and its evaluation as concurrent background tasks;
here a save of round r waits for round r's releases, which wait for its evaluation, so a checkpoint
never runs ahead of metrics.csv and the report.
An error of such a task (a full disk) would be dropped by train_model (its task manager re-raises it
in an asyncio done-callback, which only logs it) and training would go on: here it is recorded
(`RoundsReleased.failure`), no later checkpoint is saved, and the loop raises it in its own task
before the next round.
"""

import asyncio
import os
import time
from typing import Optional

import tensorflow_federated as tff
from absl import logging

from dp_ftrl_tff.programs import data_source as data_source_lib
from dp_ftrl_tff.programs import metrics_release, report_release
from dp_ftrl_tff.training import (
  canary_clients,
  checkpoint_records,
  console,
  program_evaluation,
  record_checks,
  run_config,
  run_dir,
)


class RoundsReleased:
  """Which rounds' metrics (train_model's 1-based keys) were released, and which rounds'
  evaluations (keys ('eval', r)); a save of version r waits for round r's metrics. `failure`: the
  first error of a release, a save, an evaluation or (recorded by the loop) train_model's own
  task, or None."""

  def __init__(self):
    self._events = {}
    self._ended = False
    self.failure = None

  def fail(self, error: BaseException) -> None:
    """Records `error` (the first one counts) and ends every wait, present and future: the saves
    then save nothing (train_model may have died before it started a save's release)."""
    if self.failure is None:
      self.failure = error
    self._ended = True
    for event in self._events.values():
      event.set()

  def _event(self, key) -> asyncio.Event:
    # A round (int) or another key, e.g. ('eval', round): `program_evaluation.Evaluations`'.
    event = self._events.setdefault(key if isinstance(key, tuple) else int(key), asyncio.Event())
    if self._ended:
      event.set()
    return event

  def mark(self, key: int) -> None:
    self._event(key).set()

  async def wait(self, key: int) -> None:
    await self._event(key).wait()


class RecordingRelease(tff.program.ReleaseManager):
  """Releases through `inner`; an error of the release is recorded (`RoundsReleased.fail`), not
  raised (see the module docstring). The run's model output release is one."""

  def __init__(self, inner, released: RoundsReleased):
    self._inner, self._released = inner, released

  async def release(self, value, key):
    try:
      await self._inner.release(value, key)
    except Exception as error:  # noqa: BLE001 (the loop raises it in its own task)
      self._released.fail(error)


class MarkingRelease(RecordingRelease):
  """A `RecordingRelease` that then marks the round released, also after an error (its save must
  not wait forever; it saves nothing after a failure)."""

  async def release(self, value, key):
    try:
      await super().release(value, key)
    finally:
      self._released.mark(key)


class StateManager(tff.program.FileProgramStateManager):
  """`FileProgramStateManager` that saves every `every`-th version, the last (`total_rounds`) and,
  through `save_held`, the latest one it held back (a stop); `before_save(version)` (if given)
  precedes each save and `after_save(version)` follows it. A loaded train_model `ProgramState`'s
  data iterator is replaced by `source.resume(iterator)` (given a `source`): the checkpoint's draws
  continue with the run's data source, its log path and its rounds. A save of version r >= 1 waits for round r's releases, one save at a time (concurrent saves
  race in removing old versions: TFF's check-then-rmtree fails with NotFoundError when two saves
  remove the same one). After a failed release or save (`RoundsReleased.failure`) it saves
  nothing: a checkpoint never runs ahead of what failed. Its own error is recorded there, not
  raised."""

  def __init__(self, root_dir, released: RoundsReleased, after_save, every: int,
               total_rounds: int, before_save=None,
               source: Optional[data_source_lib.SampledClientDataSource] = None, **kwargs):
    super().__init__(root_dir, **kwargs)
    self._released, self._after_save, self._before_save = released, after_save, before_save
    self._source = source
    self._every, self._total_rounds = every, total_rounds
    self._held = None  # (program_state, version) of the latest version not yet due
    self._lock = None

  async def save(self, program_state, version):
    if version % self._every and version != self._total_rounds:
      # train_model hands over a materialized state and a copy of the data iterator: kept as is.
      self._held = (program_state, version)
      return
    await self._save(program_state, version)

  async def load(self, version, structure):
    program_state = await super().load(version, structure)
    if self._source is None:
      return program_state
    return program_state._replace(data_iterator=self._source.resume(program_state.data_iterator))

  async def save_held(self) -> None:
    """Saves the version held back, if it is later than every saved one (a stopped run)."""
    if self._held is not None and self._held[1] > max(await self.get_versions() or [0]):
      await self._save(*self._held)

  async def _save(self, program_state, version):
    if version >= 1:
      await self._released.wait(version)
    if self._lock is None:
      self._lock = asyncio.Lock()
    async with self._lock:
      if self._released.failure is not None:
        return
      try:
        if self._before_save is not None:
          self._before_save(version)
        await super().save(program_state, version)
        self._after_save(version)  # the checkpoint's record (dp_ftrl_tff.training.checkpoint_records)
      except Exception as error:  # noqa: BLE001 (the loop raises it in its own task)
        self._released.fail(error)


class ProgressRelease(tff.program.ReleaseManager):
  """Adds `round_seconds` (the wall time since the previous row, the first one's since `start()`)
  to each metrics row (0-based key) of a run of `config.rounds` rounds, releases it to `managers`
  (metrics.csv, tensorboard/), then prints the round line with the ETA (`console.round_log_line`)
  and, for a row with an evaluation, the eval line (`console.eval_line`, with the epsilon `plan`
  spent in the rounds so far of the participation log at `log_path`). A round whose secure sum
  wrapped around the field (`modular_wrap` > 0) is logged as a warning and listed in
  `wrap_rounds`."""

  def __init__(self, managers, config: run_config.RunConfig, accuracy_metric: str, plan,
               log_path: str):
    self._managers, self._config, self._accuracy = tuple(managers), config, accuracy_metric
    self._plan, self._log_path = plan, log_path
    self._started = self._last = None
    self._count = 0
    self.wrap_rounds = []

  def start(self) -> None:
    """Starts the clock (before train_model: the first round's time includes its start)."""
    self._started = self._last = time.time()

  async def release(self, value, key):
    config, round_num, num_rounds = self._config, int(key), self._config.rounds
    now = time.time()
    if self._started is None:
      self.start()
    row = {**value, 'round_seconds': now - self._last}
    self._last, self._count = now, self._count + 1
    for manager in self._managers:
      await manager.release(row, key=key)
    if row.get(run_dir.MODULAR_WRAP_METRIC, 0.0) > 0:
      self.wrap_rounds.append(round_num)
      logging.warning('%s', console.modular_wrap_warning(
          round_num, num_rounds, config.secure_bits, config.secure_modclip_prob))
    mean = (now - self._started) / self._count
    console.out(console.round_log_line(
        round_num, num_rounds, row.get('train_loss', float('nan')),
        row.get(f'train_{self._accuracy}', float('nan')), row['round_seconds'],
        mean * (num_rounds - round_num - 1)))
    if any(name.startswith('eval_') for name in row):
      done = round_num + 1
      console.out(console.eval_line(done, num_rounds, row, console.spent_guarantee(
          self._plan, self._log_path, done)))

  def wrap_summary(self, start_round: int) -> None:
    """With SecAgg, after training rounds `start_round`.. (none to train: nothing), the line of the
    rounds whose secure sum wrapped (a warning when one did)."""
    config = self._config
    if not config.secure_aggregation or start_round >= config.rounds:
      return
    (logging.warning if self.wrap_rounds else console.notice)(console.wrap_summary(
        self.wrap_rounds, start_round, config.rounds, config.secure_bits))


class CanaryRounds(tff.program.ReleaseManager):
  """Holds each round's canary projections (train_model's released value and 1-based key) until
  `write(version)` appends those of the rounds before `version` to canaries.csv
  (`canary_clients.CanaryRecorder.record_round`): the state manager writes them just before the
  checkpoint of `version`, so canaries.csv holds exactly the checkpointed rounds when the
  checkpoint's record describes it (train_model releases round r + 1 while round r saves)."""

  def __init__(self, recorder: canary_clients.CanaryRecorder):
    self._recorder, self._held = recorder, {}

  async def release(self, value, key):
    self._held[int(key) - 1] = value['aggregator']

  def write(self, version: int) -> None:
    for round_num in sorted(r for r in self._held if r < version):
      self._recorder.record_round(round_num, self._held.pop(round_num))


def canary_recorder(output_dir: str, start, num_params: int
                    ) -> Optional[canary_clients.CanaryRecorder]:
  """The `canary_clients.CanaryRecorder` of the run `start` in `output_dir` (`run_start.RunStart`; a model of
  `num_params` trainable parameters) with its files started (a resume trims canaries.csv to its
  checkpoint's record and rebuilds a missing or altered canaries.json), or None without canaries."""
  if start.canaries is None:
    return None
  recorder = canary_clients.CanaryRecorder(start.canaries, start.canary_ids,
                                           output_dir, num_params, start.plan, start.run_id)
  resumption = start.resumption
  if not resumption.fresh:
    checkpoint_records.trim_files(output_dir, resumption)
  recorder.start_files(resumption.fresh, start.rebuild)
  if not resumption.fresh:
    record_checks.check_rebuilt(output_dir, resumption, start.rebuild)
  return recorder


class Managers:
  """The run's state manager (`state`, continuing a loaded checkpoint with `source`, the run's
  data source), its metrics release (`metrics`) and their parts: `csv` (metrics.csv), `progress`
  (the round times, the console and the SecAgg wraps: `ProgressRelease`), `report` (privacy_report/, None with canaries:
  the report then needs the final model's canary cosines and is built at the end) and
  `evaluations` (the aggregated-metrics manager of the run's EvaluationManager, whose results
  go into their rounds' rows: `program_evaluation`);
  `released.failure` is the first error of their background tasks (a release or a save), or None.
  With `canaries` (the run's `CanaryRecorder`) the canary rows go with the checkpoints and the
  records vouch for the canary files."""

  def __init__(self, config: run_config.RunConfig, output_dir: str, plan, accuracy_metric: str,
               run_id: str,
               source: data_source_lib.SampledClientDataSource,
               canaries: Optional[canary_clients.CanaryRecorder] = None):
    out = output_dir
    path = lambda *names: os.path.join(out, *names)  # noqa: E731
    settings = run_config.hparams_document(config)
    self.released = released = RoundsReleased()
    # The record binds the run's files: the strategy file, the participation log's bytes so far
    # (the data source cuts the log back to its checkpointed offset on resume; the record proves
    # what lies before it), the metrics rows of the checkpointed rounds (each with its evaluation:
    # the save waits for its row) and the canary files.
    canary_rounds = None if canaries is None else CanaryRounds(canaries)
    self.state = StateManager(
        checkpoint_records.checkpoints_dir(out), released,
        lambda version: checkpoint_records.write_record(
            out, version, settings, checkpoint_records.plan_document(plan), run_id),
        every=config.checkpoint_every, total_rounds=config.rounds,
        before_save=None if canary_rounds is None else canary_rounds.write, source=source,
        keep_total=3)
    self.report = None if canaries is not None else report_release.PrivacyReportReleaseManager(
        path(run_dir.PLAN_FILE), path(run_dir.PARTICIPATION_FILE), path(run_dir.REPORT_DIR),
        total_rounds=config.rounds, metrics=path(run_dir.METRICS_FILE))
    self.csv = tff.program.CSVFileReleaseManager(path(run_dir.METRICS_FILE),
                                                 key_fieldname='round')
    self.progress = ProgressRelease(
        [self.csv, tff.program.TensorBoardReleaseManager(path('tensorboard'))], config,
        accuracy_metric, plan, path(run_dir.PARTICIPATION_FILE))
    self.evaluations = program_evaluation.Evaluations(released)
    rows = program_evaluation.EvaluatedRows([self.progress], self.evaluations)
    self.metrics = MarkingRelease(metrics_release.RoundMetricsReleaseManager(
        [rows], after_metrics=[canary_rounds or self.report]), released)
