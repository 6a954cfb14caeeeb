"""DP-FTRL inside TFF's program structure (`tff.program`, `tff.learning.programs.train_model`).

`data_source.SampledClientDataSource` selects each round's clients with the project's samplers,
writes the participation log as it goes, and restores both from the program state on restart.
"""
