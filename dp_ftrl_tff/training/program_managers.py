"""The training loop's managers, as `tff.learning.programs.train_model` is given them.

`Managers(config, plan, accuracy_metric, run_id, source, canaries)` holds what
`tff.learning.programs.train_model` is given for a run (`dp_ftrl_tff.training.training_loop`): the
program state manager (checkpoints/program_state_<r> every `checkpoint_every` rounds, each followed
by its record, `dp_ftrl_tff.training.checkpoint_records`; a loaded checkpoint's data iterator continues
with the run's data source) and the metrics release (the rows of metrics.csv and tensorboard/, each
with its round's evaluation when there is one and its `round_seconds`, the console lines, then the
privacy report or the canary rows: `programs.metrics_release`, `program_evaluation`,
`programs.report_release`, `canary_release`). Each manager type is its own module: `state_manager`,
`progress_release`, `canary_release`, `program_evaluation` (the EvaluationManager that resumes) and
`release_order` (the order they keep and the run's first failure).

train_model starts a round's save, its releases and its evaluation as concurrent background tasks;
here a save of round r waits for round r's releases, which wait for its evaluation, so a checkpoint
never runs ahead of metrics.csv and the report.
An error of such a task (a full disk) would be dropped by train_model (its task manager re-raises it
in an asyncio done-callback, which only logs it) and training would go on: here it is recorded
(`RoundsReleased.failure`), no later checkpoint is saved, and the loop raises it in its own task
before the next round.
"""

import os
from typing import Optional

import tensorflow_federated as tff

from dp_ftrl_tff.programs import data_source as data_source_lib
from dp_ftrl_tff.programs import metrics_release, report_release
from dp_ftrl_tff.training import checkpoint_records, program_evaluation, run_config, run_dir
from dp_ftrl_tff.training.canary_clients import CanaryRecorder
from dp_ftrl_tff.training.canary_release import CanaryRounds
from dp_ftrl_tff.training.progress_release import ProgressRelease
from dp_ftrl_tff.training.release_order import MarkingRelease, RoundsReleased
from dp_ftrl_tff.training.state_manager import StateManager


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
               canaries: Optional[CanaryRecorder] = None):
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
