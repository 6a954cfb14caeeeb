"""Shared test helpers: tiers, the subprocess harness for the binaries, and the shared tiny runs."""
