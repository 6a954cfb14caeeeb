"""Writes the privacy report of a `tff.program` training run through a release manager.

`PrivacyReportReleaseManager` is a `tff.program.ReleaseManager` keyed by `train_model`'s 1-based
round number (rounds done). At the last round it writes the run's report (report.json, report.md,
plots) into `output_dir`, the drivers' `privacy_report/`, and with `every=K` also after every K
rounds into `output_dir/round_<key>/` (the report of rounds 0 .. key-1). It builds the report with
`accounting.report_files.report_from_run_files` from the plan file, the participation log and the
metrics CSV, the one report builder of the drivers and of `experiments.privacy_report --plan=...
--participation_log=... --metrics=...`, so the reports are the same bytes.

Put it in `metrics_release.RoundMetricsReleaseManager(..., after_metrics=[report])`, so the round's
metrics row (the clip, SecAgg's wrap flags) is in the metrics CSV before the report reads it.
"""

import asyncio
import functools
import os
from typing import Optional

import numpy as np
import tensorflow_federated as tff
from absl import logging

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import report_files, report_render

#: The subdirectory of an intermediate report, after `key` rounds.
ROUND_DIR = 'round_{key}'


def _check_path(value, name: str, required: bool = True):
  if value is None and not required:
    return None
  if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
    raise ValueError(f'`{name}` must be a non-empty path, got {value!r}.')
  return os.fspath(value)


class PrivacyReportReleaseManager(tff.program.ReleaseManager):
  """Writes the privacy report at train_model's last round (and optionally every K rounds).

  `release(value, key)` ignores `value`; `key` is train_model's 1-based round number (rounds done).
  When `key == total_rounds` it writes the report of the whole run into `output_dir`; when
  `every` is set and `key % every == 0` (a test on the key, not a counter, so a restarted program
  keeps the schedule) it writes the report of rounds 0 .. key-1 into `output_dir/round_<key>/`,
  leaving out the log's and metrics' rows of later rounds (a restarted program may have logged
  them already). Other keys write nothing. The plan is read from `plan` at each release, as
  `privacy_report --plan` reads it. The report is built off the event loop (it takes seconds).
  A plan without noise has no guarantee: the release logs a warning and writes nothing (as the
  drivers do).
  """

  def __init__(self, plan: str, participation_log: str, output_dir: str, *, total_rounds: int,
               metrics: Optional[str] = None, canaries: Optional[str] = None,
               every: Optional[int] = None, plots: bool = True):
    """Args:
      plan: the run's plan.json (`plan.save_plan`).
      participation_log: the run's participation log (the data source's `participation_log`).
      output_dir: the final report's directory (the drivers' RUN/privacy_report).
      total_rounds: train_model's `train_total_rounds` (n >= 1).
      metrics: the run's metrics CSV (the CSV manager of a `RoundMetricsReleaseManager`); required
        for SecAgg plans, and the source of adaptive clipping's final clip.
      canaries: the run's canary record, or None.
      every: K >= 1: also a report after every K rounds; None: only at the end.
      plots: whether to write the report's plots.

    Raises:
      ValueError: naming the parameter, on a bad path, `total_rounds` or `every`.
    """
    self._plan = _check_path(plan, 'plan')
    self._log = _check_path(participation_log, 'participation_log')
    self._output_dir = _check_path(output_dir, 'output_dir')
    self._total_rounds = _validation.check_positive_int(total_rounds, 'total_rounds')
    self._metrics = _check_path(metrics, 'metrics', required=False)
    self._canaries = _check_path(canaries, 'canaries', required=False)
    self._every = None if every is None else _validation.check_positive_int(every, 'every')
    if not isinstance(plots, bool):
      raise ValueError(f'`plots` must be a bool, got {plots!r}.')
    self._plots = plots
    self._last_report = None

  @property
  def last_report(self):
    """The `report.PrivacyReport` this manager wrote last (None before its first report)."""
    return self._last_report

  def output_dir_for(self, key: int) -> Optional[str]:
    """Where the release of round `key` (1-based) writes its report; None if it writes none."""
    if key == self._total_rounds:
      return self._output_dir
    if self._every is not None and key % self._every == 0 and key < self._total_rounds:
      return os.path.join(self._output_dir, ROUND_DIR.format(key=key))
    return None

  def _write(self, key: int, output_dir: str) -> None:
    plan = plan_lib.load_plan(self._plan)
    if plan.noise_multiplier == 0:
      logging.warning('Noise multiplier 0: the run has no differential-privacy guarantee.')
      return
    final = key == self._total_rounds
    # After `key` rounds the log covers them all, even when the last drew nobody (random cohorts'
    # empty rounds write no row).
    report = report_files.report_from_run_files(
        plan, self._log, metrics=self._metrics, canaries=self._canaries,
        num_rounds=None if final else key, trained_rounds=key if final else None)
    report_render.write_report(report, output_dir, plots=self._plots)
    self._last_report = report

  async def release(self, value, key: int) -> None:
    """Writes the report due after `key` rounds (1-based), if any; see the class docstring.

    Raises:
      ValueError: `key` is not an int in 1 .. total_rounds; the report's errors.
    """
    del value  # the report reads the run's files, not the released value
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)) or not (
        1 <= key <= self._total_rounds):
      raise ValueError(f'`key` must be train_model\'s round number in 1 .. {self._total_rounds}, '
                       f'got {key!r}.')
    output_dir = self.output_dir_for(int(key))
    if output_dir is None:
      return
    await asyncio.get_running_loop().run_in_executor(
        None, functools.partial(self._write, int(key), output_dir))
