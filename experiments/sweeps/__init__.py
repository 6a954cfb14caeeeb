"""Sweeps of driver runs: the runner, the grid it expands, and the summary of finished runs."""
