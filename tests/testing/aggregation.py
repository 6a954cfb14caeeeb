"""Every streaming mechanism's aggregation process on tiny client values, and three rounds of each:
the same computations run in the local TFF context and on remote workers (tests/experiments/
workers_test.py compares the two)."""

import os

import numpy as np

from dp_ftrl_tff.training import run_setup
from experiments.run import driver_config


def processes() -> dict:
  """Each streaming mechanism's aggregation process (and BLT's with adaptive clipping) for float32[5]
  client values, with a fixed noise seed: {name: process}."""
  import tensorflow_federated as tff

  from dp_ftrl_tff import aggregators
  from dp_ftrl_tff import plan as plan_lib
  from dp_ftrl_tff.mechanisms import registry

  cases = [(name, False) for name in registry.names(streaming_only=True)] + [('blt', True)]
  processes = {}
  for name, adaptive in cases:
    # The strategy a driver would build for a 3-round run (optimized where the mechanism needs it).
    strategy = run_setup.run_strategy(driver_config.DriverConfig(
        root_output_dir=os.devnull, mechanism=name, rounds=3))[0].strategy
    plan = plan_lib.RunPlan.build(strategy, 0.5, 7, 1.0, adaptive_clip=adaptive or None)
    processes[f'{name}{"+adaptive" if adaptive else ""}'] = aggregators.CorrelatedNoiseFactory(
        plan, noise_seed=11).create(tff.TensorType(np.float32, [5]))
  return processes


def run_three_rounds(processes: dict) -> dict:
  """Three rounds of each process on 7 fixed clients in the current TFF context:
  {name: [[result..., clip] per round]}."""
  rng = np.random.default_rng(7)
  rounds = [[rng.normal(size=5).astype(np.float32) for _ in range(7)] for _ in range(3)]
  results = {}
  for name, process in processes.items():
    state = process.initialize()
    outputs = []
    for values in rounds:
      output = process.next(state, values)
      state = output.state
      outputs.append(np.asarray(output.result).tolist() + [float(output.measurements['clip'])])
    results[name] = outputs
  return results
