"""DP-FTRL learning processes and min-sep client sampling.

The participation log the training loop writes lives in `dp_ftrl_tff.accounting.participation_log`.
"""
