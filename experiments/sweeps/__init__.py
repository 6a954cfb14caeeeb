"""Sweeps of driver runs: the grid a sweep expands, and the table of finished runs."""
