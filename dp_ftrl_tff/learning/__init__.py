"""DP-FTRL learning processes, min-sep client sampling and (cyclic) Poisson client sampling.

The participation log the training loop writes lives in `dp_ftrl_tff.accounting.participation_log`.
"""
