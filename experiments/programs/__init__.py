"""Example `tff.program` binaries: DP-FTRL through `tff.learning.programs.train_model`."""
