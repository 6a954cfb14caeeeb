"""DP-FTRL learning processes, min-sep client sampling and the participation log."""
