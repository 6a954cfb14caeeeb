"""The privacy report of a run from its inputs: the one report builder of every run and binary.

`report_from_run_files` builds a `report.PrivacyReport` from a run's plan (a `plan.RunPlan` or its
`plan.json`), its participation log (`participation.csv`), its per-round metrics CSV
(`metrics.csv`, for a SecAgg run's segments and adaptive clipping's final clip) and its canary
record (`canaries.json`). The drivers' end of run (`dp_ftrl_tff.training.run_report.finish`), the
programs' `programs.report_release.PrivacyReportReleaseManager` and `python -m
experiments.privacy_report` all call it, so a driver's report and `privacy_report
--plan=RUN/plan.json --participation_log=RUN/participation.csv --metrics=RUN/metrics.csv
[--canaries=...]` on the same run are the same bytes (the report holds no wall time; only the log's path differs when it is
given another way). `read_log` is its log reader, for a caller that needs the log before the plan
(the binary's calibration). A file that is missing or does not parse is a
`RunFileError` naming its input and path. No TensorFlow.

Conventions: rounds are 0-based; `num_rounds` = n means rounds 0 .. n-1 (the report of the first
n rounds of a run, with the log's and the metrics' later rows left out).
"""

import csv
import os
from typing import Optional, Union

import numpy as np

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.accounting import report_empirical, report_participation, run_metrics

Path = Union[str, os.PathLike]


class RunFileError(ValueError):
  """A run file that is missing or cannot be read as what it should be (bad input). The message
  names the input (`participation_log`, `metrics`, `canaries`) and the path."""

  def __init__(self, name: str, path: str, error: Optional[Exception] = None):
    if error is None or not os.path.isfile(path):
      message = f'`{name}`: no file at {path!r}.'
    else:
      message = f'`{name}`: {error} Fix or regenerate {path}.'
    super().__init__(message)


_READ_ERRORS = (ValueError, OSError, csv.Error)


def read_log(path: Path) -> log_lib.ParticipationLog:
  """The participation log at `path`, with at least one row; `RunFileError` otherwise."""
  path = os.fspath(path)
  try:
    log = log_lib.read_participation_log(path)
  except _READ_ERRORS as e:
    raise RunFileError('participation_log', path, e) from None
  if not log.num_rows:
    raise ValueError(f'`participation_log`: {path} has no rows.')
  return log


def read_canary_record(path: Path) -> auditing.CanaryRecord:
  """The canary record at `path` (`auditing.read_canaries`); `RunFileError` otherwise."""
  path = os.fspath(path)
  try:
    return auditing.read_canaries(path)
  except _READ_ERRORS as e:
    raise RunFileError('canaries', path, e) from None


def _secure_segments(plan: plan_lib.RunPlan, metrics: Optional[str],
                     num_rounds: Optional[int]) -> Optional[dict]:
  """With SecAgg, the segments and wrapped rounds of `metrics` (required), else None."""
  if plan.secure is None:
    return None
  if metrics is None:
    raise ValueError('`metrics` is required for a SecAgg plan: its segments and wrapped rounds '
                     'are in the run\'s metrics.csv.')
  try:
    segments = run_metrics.read_secure_segments(metrics, max_rounds=num_rounds)
  except _READ_ERRORS as e:
    raise RunFileError('metrics', metrics, e) from None
  if not segments['segments']:
    raise RunFileError('metrics', metrics,
                       ValueError(f'{metrics} holds no rounds of a SecAgg run.'))
  return segments


def _final_clip(plan: plan_lib.RunPlan, metrics: Optional[str],
                num_rounds: Optional[int]) -> Optional[float]:
  """With adaptive clipping and `metrics`, the clip of the run's last round, else None."""
  if plan.adaptive_clip is None or metrics is None:
    return None
  try:
    return run_metrics.read_final_clip(metrics, max_rounds=num_rounds)
  except _READ_ERRORS as e:
    raise RunFileError('metrics', metrics, e) from None


def _plan_of(plan: Union[plan_lib.RunPlan, Path], num_rounds: Optional[int]) -> plan_lib.RunPlan:
  """The plan (loaded from its plan.json), with `num_rounds` in place of its rounds when set."""
  if isinstance(plan, (str, os.PathLike)):
    plan = plan_lib.load_plan(os.fspath(plan))
  elif not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a RunPlan or the path of a plan.json, got {plan!r}.')
  if plan.noise_multiplier == 0:
    raise ValueError('`plan` has noise multiplier 0: the run has no differential-privacy '
                     'guarantee to report.')
  if num_rounds is None:
    return plan
  if isinstance(num_rounds, (bool, np.bool_)) or not isinstance(num_rounds, (int, np.integer)) \
      or num_rounds < 1:
    raise ValueError(f'`num_rounds` must be a positive int or None, got {num_rounds!r}.')
  return plan_lib.RunPlan.from_config({**plan.to_config(), 'num_rounds': int(num_rounds)})


def report_from_run_files(
    plan: Union[plan_lib.RunPlan, Path],
    participation_log: Union[Path, log_lib.ParticipationLog, None] = None, *,
    metrics: Optional[Path] = None,
    canaries: Optional[Path] = None,
    num_rounds: Optional[int] = None, trained_rounds: Optional[int] = None,
    run_id: Optional[str] = None, log_complete: bool = True, observed_patterns: bool = True,
    equal_privacy: bool = True, require_amplification: bool = False) -> report_lib.PrivacyReport:
  """The privacy report of a run, from its plan and files.

  Args:
    plan: the run's `RunPlan`, or the path of its `plan.json` (`plan.load_plan`). Its noise
      multiplier must be > 0 (a run without noise has no guarantee to report).
    participation_log: the run's `client_id,round` log (`participation.csv`, or the
      `ParticipationLog` read from it with `read_log`); the headline then uses the participation
      observed in it. None: the plan's declared participation (it must have rounds and one).
    metrics: the run's metrics CSV (`metrics.csv`, keyed by the 0-based `round`). Read with SecAgg
      (the segments and the rounds whose secure sum wrapped; then required) and with adaptive
      clipping (the final clip; a missing file gives none).
    canaries: the run's canary record (`canaries.json`), for the empirical epsilon; needs the
      log; None without canary clients.
    num_rounds: if set, the report of the first `num_rounds` rounds (0 .. num_rounds - 1): the
      plan's rounds are replaced, and the log's and metrics' rows of later rounds are left out.
    trained_rounds: without `num_rounds`, the rounds the run trained as its own records show them
      (the loop that trained them; a checkpoint record), or None: the log then covers rounds 0 ..
      trained_rounds - 1 even when the last of them drew nobody (random cohorts' empty rounds
      write no row), and holds no later round.
    run_id: the identity of the run the files are of (`auditing.RUN_ID_PATTERN`, from its checkpoint
      records), or None when unknown; `canaries` recorded by another run are refused.
    log_complete: without `num_rounds`, the log must cover the plan's every round (False when the
      plan's rounds were set by hand, as `privacy_report --rounds` does).
    observed_patterns, equal_privacy, require_amplification: as `report.build_report`'s.

  Returns:
    The `report.PrivacyReport` (write it with `report_render.write_report`).

  Raises:
    ValueError: naming the parameter, on a plan without noise, a bad `num_rounds`, a missing
      `metrics` for a SecAgg run, a file that is missing or does not parse (`RunFileError`), a
      participation log that cannot be the plan's (`report_participation.check_log_of_plan`) or
      canaries that cannot be the run's, naming the file.
  """
  plan = _plan_of(plan, num_rounds)
  auditing.check_run_id(run_id, 'run_id')
  if trained_rounds is not None and num_rounds is not None:
    raise ValueError('`trained_rounds` and `num_rounds` exclude each other: the report of the '
                     'first `num_rounds` rounds leaves the later ones out.')
  metrics = None if metrics is None else os.fspath(metrics)
  # The reading order (metrics, log, metrics, canaries) is the drivers' one, so a run with several
  # bad files reports the same first error as before.
  secure_segments = _secure_segments(plan, metrics, num_rounds)
  log = (participation_log if participation_log is None
         or isinstance(participation_log, log_lib.ParticipationLog)
         else read_log(participation_log))
  if log is not None and num_rounds is not None:
    log = log.first_rounds(num_rounds)
  final_clip = _final_clip(plan, metrics, num_rounds)
  record = None if canaries is None else read_canary_record(canaries)
  if record is not None and run_id is not None and record.run_id != run_id:
    raise ValueError(f'`canaries`: {os.fspath(canaries)} was recorded by '
                     f'{"another run" if record.run_id else "no identified run"} (run '
                     f'{record.run_id}), not by the run of this participation log (run {run_id}): '
                     'its canaries never took part in these rounds. Give the canaries.json of the '
                     'same run directory.')
  try:
    return report_lib.build_report(
        plan, log, observed_patterns=observed_patterns, secure_segments=secure_segments,
        equal_privacy=equal_privacy, require_amplification=require_amplification,
        final_clip=final_clip, canaries=record,
        log_complete=log_complete and num_rounds is None, trained_rounds=trained_rounds)
  except report_participation.LogMismatchError as e:
    raise ValueError(f'`participation_log`: {log.path} cannot be the log of this plan: '
                     f'{e.reason}') from None
  except report_empirical.CanaryMismatchError as e:
    raise ValueError(f'`canaries`: {os.fspath(canaries)}: {e.reason}') from None
