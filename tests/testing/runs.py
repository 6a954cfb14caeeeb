"""Tiny in-process driver runs: configurations that train a round in about a second, and readers of
what a run writes that do not share code with the writers."""

import csv

from experiments.run import driver_config


def tiny_config(root, **overrides) -> driver_config.DriverConfig:
  """A tiny run: 30 clients, 3 per round, min_sep 2, 2 rounds, fixed seeds."""
  settings = dict(root_output_dir=str(root), rounds=2, clients_per_round=3, client_batch_size=8,
                  synthetic_num_clients=30, synthetic_examples_per_client=8, min_sep=2,
                  noise_multiplier=0.5, noise_seed=3, seed=1, checkpoint_every=1, eval_every=1,
                  eval_max_examples=64, mechanism='gaussian')
  settings.update(overrides)
  return driver_config.DriverConfig(**settings)


def read_log(path):
  """client -> sorted rounds, read with the csv module (independent of the writer)."""
  history = {}
  with open(path, newline='') as f:
    for row in csv.DictReader(f):
      history.setdefault(row['client_id'], []).append(int(row['round']))
  return {c: sorted(r) for c, r in history.items()}
