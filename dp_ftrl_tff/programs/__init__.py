"""DP-FTRL inside TFF's program structure (`tff.program`, `tff.learning.programs.train_model`).

`data_source.SampledClientDataSource` selects each round's clients with the project's samplers,
writes the participation log as it goes, and restores both from the program state on restart;
`client_ids.process_over_client_ids` is the process that takes those ids (canaries included).
`metrics_release.RoundMetricsReleaseManager` releases `train_model`'s per-round metrics as
metrics.csv rows, and `report_release.PrivacyReportReleaseManager` writes the privacy report
(at the last round, optionally every K rounds) through the drivers' report path
(`accounting.report_files.report_from_run_files`).
"""
