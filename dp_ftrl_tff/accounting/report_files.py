"""The privacy report of a run from its files: the one report path of the drivers and programs.

`report_from_run_files` builds a `report.PrivacyReport` from a run's plan (a `plan.RunPlan` or its
`plan.json`), its participation log (`participation.csv`), its per-round metrics CSV
(`metrics.csv`, for a SecAgg run's segments and adaptive clipping's final clip) and its canary
record (`canaries.json`), with every mechanism compared at equal privacy. The drivers
(`experiments.run.run_report.finish`) and `programs.report_release.PrivacyReportReleaseManager`
call it, and it reads what `experiments.privacy_report --plan=RUN/plan.json
--participation_log=RUN/participation.csv --metrics=RUN/metrics.csv [--canaries=...]` reads, so
their reports are equal (apart from the optimizers' wall times). No TensorFlow.

Conventions: rounds are 0-based; `num_rounds` = n means rounds 0 .. n-1 (the report of the first
n rounds of a run, with the log's and the metrics' later rows left out).
"""

import os
from typing import Optional, Union

import numpy as np

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.accounting import run_metrics


def _first_rounds(log: log_lib.ParticipationLog, num_rounds: int) -> log_lib.ParticipationLog:
  """`log` without its rows of rounds >= `num_rounds` (the same object when it has none)."""
  if log.num_rounds <= num_rounds:
    return log
  ids, rounds = log.rows_of([log.client_id(code) for code in range(log.num_clients)])
  keep = rounds < num_rounds
  return log_lib.ParticipationLog.from_arrays(ids[keep], rounds[keep], path=log.path)


def report_from_run_files(plan: Union[plan_lib.RunPlan, str, os.PathLike],
                          participation_log: Union[str, os.PathLike], *,
                          metrics: Optional[Union[str, os.PathLike]] = None,
                          canaries: Optional[Union[str, os.PathLike]] = None,
                          num_rounds: Optional[int] = None) -> report_lib.PrivacyReport:
  """The privacy report of a run, from its plan and files, as the drivers write it.

  Args:
    plan: the run's `RunPlan`, or the path of its `plan.json` (`plan.load_plan`). Its noise
      multiplier must be > 0 (a run without noise has no guarantee to report).
    participation_log: the run's `client_id,round` log (`participation.csv`); the headline uses
      the participation observed in it.
    metrics: the run's metrics CSV (`metrics.csv`, keyed by the 0-based `round`). Read with SecAgg
      (the segments and the rounds whose secure sum wrapped; then required) and with adaptive
      clipping (the final clip; a missing file gives none).
    canaries: the run's canary record (`canaries.json`), for the empirical epsilon; None without
      canary clients.
    num_rounds: if set, the report of the first `num_rounds` rounds (0 .. num_rounds - 1): the
      plan's rounds are replaced (as `privacy_report --rounds`), and the log's and metrics' rows of
      later rounds are left out.

  Returns:
    The `report.PrivacyReport` (write it with `report_render.write_report`).

  Raises:
    ValueError: naming the parameter, on a plan without noise, a bad `num_rounds`, a missing
      `metrics` for a SecAgg run, unreadable files (as their readers raise), a participation log
      that cannot be the plan's (`report.check_log_of_plan`; without `num_rounds` it must reach the
      plan's last round) or canaries that cannot be the run's, naming the file; OSError when a
      file cannot be read.
  """
  if isinstance(plan, (str, os.PathLike)):
    plan = plan_lib.load_plan(os.fspath(plan))
  elif not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a RunPlan or the path of a plan.json, got {plan!r}.')
  if plan.noise_multiplier == 0:
    raise ValueError('`plan` has noise multiplier 0: the run has no differential-privacy '
                     'guarantee to report.')
  if num_rounds is not None:
    if isinstance(num_rounds, (bool, np.bool_)) or not isinstance(num_rounds, (int, np.integer)) \
        or num_rounds < 1:
      raise ValueError(f'`num_rounds` must be a positive int or None, got {num_rounds!r}.')
    num_rounds = int(num_rounds)
    plan = plan_lib.RunPlan.from_config({**plan.to_config(), 'num_rounds': num_rounds})
  if metrics is not None:
    metrics = os.fspath(metrics)
  # The reading order (metrics, log, metrics, canaries) is the drivers' one, so a run with several
  # bad files reports the same first error as before.
  secure_segments = None
  if plan.secure is not None:
    if metrics is None:
      raise ValueError('`metrics` is required for a SecAgg plan: its segments and wrapped rounds '
                       'are in the run\'s metrics.csv.')
    secure_segments = run_metrics.read_secure_segments(metrics, max_rounds=num_rounds)
  log = log_lib.read_participation_log(os.fspath(participation_log))
  if num_rounds is not None:
    log = _first_rounds(log, num_rounds)
  final_clip = (run_metrics.read_final_clip(metrics, max_rounds=num_rounds)
                if plan.adaptive_clip and metrics is not None else None)
  canary_record = None if canaries is None else auditing.read_canaries(os.fspath(canaries))
  try:
    return report_lib.build_report(plan, log, secure_segments=secure_segments, equal_privacy=True,
                                   final_clip=final_clip, canaries=canary_record,
                                   log_complete=num_rounds is None)
  except report_lib.LogMismatchError as e:
    raise ValueError(f'`participation_log`: {os.fspath(participation_log)} cannot be the log of '
                     f'this plan: {e.reason}') from None
  except report_lib.CanaryMismatchError as e:
    raise ValueError(f'`canaries`: {os.fspath(canaries)}: {e.reason}') from None
