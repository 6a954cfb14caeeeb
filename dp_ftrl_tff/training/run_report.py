"""The end of a driver run: its privacy report, its completion marker and the closing summary.

`finish` builds the report from the run's plan, participation log and metrics with
`accounting.report_files.report_from_run_files`, the one report builder, which a `tff.program`
program's `programs.report_release.PrivacyReportReleaseManager` and `experiments.privacy_report
--plan=RUN/plan.json --participation_log=RUN/participation.csv --metrics=RUN/metrics.csv
[--canaries=RUN/canaries.json]` call too, so their report.json and report.md are the same bytes;
then it marks the run complete (`summary.json`, written last) and prints the summary.
"""

import os
from typing import Optional

from absl import logging

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.accounting import report_files, report_render
from dp_ftrl_tff.training import console, run_config, run_dir, run_summary, stop_signals
from dp_ftrl_tff.training.run_config import RunConfig


def finish(config: RunConfig, output_dir: str, plan: plan_lib.RunPlan, accuracy_metric: str, *,
           trained: bool, rounds_done: int, run_id: str,
           report: Optional[report_lib.PrivacyReport] = None
           ) -> Optional[report_lib.PrivacyReport]:
  """Writes the privacy report of the run in `output_dir`, then (when rounds were `trained` or the marker is missing)
  the completion marker, and prints the summary; returns the report (None without noise).
  `rounds_done` is the rounds the run has trained (its last checkpoint's), `run_id` its identity.

  The report (`privacy_report/`: report.json, report.md with the BLT paper's App. C checklist,
  plots, every mechanism at equal privacy) comes from the plan, the participation log and the
  metrics through `report_files.report_from_run_files`, as `experiments.privacy_report
  --plan=RUN/plan.json --participation_log=RUN/participation.csv --metrics=RUN/metrics.csv` does,
  so the two are the same bytes.
  With adaptive clipping, `run_facts.final_clip` is the clip of the last round in metrics.csv
  (`run_dir.read_final_clip`). Its headline uses the
  participation observed in `participation.csv`; the declared schema's guarantee is under
  `declared`, and any violation of it is a warning. With random sampling the amplified guarantee
  stands beside the headline; with SecAgg the report lists each segment's post-rounding bound and
  the rounds whose secure sum wrapped; with `canary_clients`, the empirical epsilon of the run's
  canaries (`canaries.json`, as `privacy_report --canaries=RUN/canaries.json`). The completion
  marker is the TensorBoard HParams session and
  final scalars, then `summary.json`, written last and atomically (its presence means the run
  finished). A `report` already written to `privacy_report/` from the same files (a `tff.program`
  program's report release) is used as it is, not built again. A stop signal is seen before the
  report, inside its computations (`dp_ftrl_tff.stopping`) and before the marker; none after it.
  """
  complete = not trained and run_summary.is_complete(output_dir)
  stop_signals.check()
  if report is not None:
    pass
  elif plan.noise_multiplier == 0:
    logging.warning('Noise multiplier 0: the run has no differential-privacy guarantee.')
  else:
    # The run trained `rounds_done` rounds: its log covers them all, even when the last drew
    # nobody (random cohorts' empty rounds write no row).
    report = report_files.report_from_run_files(
        plan, os.path.join(output_dir, run_dir.PARTICIPATION_FILE),
        metrics=os.path.join(output_dir, run_dir.METRICS_FILE),
        canaries=(os.path.join(output_dir, auditing.CANARY_FILE) if config.canary_clients
                  else None), trained_rounds=rounds_done, run_id=run_id)
    report_render.write_report(report, os.path.join(output_dir, run_dir.REPORT_DIR))
  stop_signals.check()
  if not complete:
    guarantee = None if report is None else report.guarantee
    summary = run_summary.build_summary(
        output_dir, rounds=config.rounds, hparams=run_config.hparams_document(config),
        accuracy_metric=accuracy_metric,
        noise_multiplier=plan.noise_multiplier,
        epsilon=None if guarantee is None else guarantee.epsilon,
        delta=None if guarantee is None else guarantee.delta,
        rho=None if guarantee is None else guarantee.rho,
        epsilon_is_zcdp_bound=guarantee is not None and guarantee.epsilon_is_zcdp_bound)
    run_summary.write_hparams_summary(output_dir, summary)
    run_summary.write_summary(output_dir, summary)
  console.out(console.summary(
      output_dir, None if report is None else report_render.summary(report, warnings=False)))
  for warning in [] if report is None else report.warnings:
    console.warn(warning)
  return report
