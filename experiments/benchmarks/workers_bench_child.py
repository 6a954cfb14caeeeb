"""The child process of `workers_bench`: one worker count, every (model size, clients) setting.

`run_child(spec)` builds the FedAvg process with a BLT aggregator for each model size (a dense
64 -> H -> H -> 10 Keras model, `hidden_width`), times `spec['rounds']` rounds per clients count
(after one warm-up round per model) and prints one `RESULT <json>` line per setting: wall, driver
CPU and workers' CPU seconds per round, the mergeable context's phases, peak memory. See
`workers_bench` for the figures and the runs.
"""

import json
import math
import os
import resource
import time

from experiments.benchmarks import harness, tff_rounds

INPUT_DIM = 64
CLASSES = 10
NOISE_MULTIPLIER = 1.0
CLIP = 1.0


def hidden_width(params: float) -> int:
  """The H >= 1 whose 64 -> H -> H -> 10 dense model has the weight count closest to `params`."""
  root = (-(INPUT_DIM + CLASSES + 2) + math.sqrt((INPUT_DIM + CLASSES + 2)**2 + 4 * (params - 10)))
  candidates = {max(1, math.floor(root / 2)), max(1, math.ceil(root / 2))}
  return min(candidates, key=lambda h: abs(weight_count(h) - params))


def weight_count(hidden: int) -> int:
  return (INPUT_DIM + 1) * hidden + (hidden + 1) * hidden + (hidden + 1) * CLASSES



class _PhaseClock:
  """Times the mergeable context's calls (up to merge, merge, after merge) on the driver."""

  def __init__(self):
    from tensorflow_federated.python.core.impl.execution_contexts import (
      mergeable_comp_execution_context as mergeable,
    )
    self.events = []
    for name, kind in (('_invoke_up_to_merge_and_return_context', 'up'),
                       ('_merge_results', 'merge'), ('_compute_after_merged', 'after')):
      setattr(mergeable, name, self._timed(getattr(mergeable, name), kind))

  def _timed(self, function, kind):
    async def timed(*args, **kwargs):
      start = time.perf_counter()
      try:
        return await function(*args, **kwargs)
      finally:
        self.events.append((kind, start, time.perf_counter()))
    return timed

  def phases(self) -> dict:
    """The phases of the calls since the last `phases()` (seconds; empty if none ran)."""
    events, self.events = self.events, []
    ups = [e for e in events if e[0] == 'up']
    afters = [e for e in events if e[0] == 'after']
    if not ups or not afters:
      return {}
    last_up = max(e[2] for e in ups)
    return {'up': last_up - min(e[1] for e in ups),
            'merge': sum(e[2] - e[1] for e in events if e[0] == 'merge'),
            'merges': sum(e[0] == 'merge' for e in events),
            'tail': max(0.0, min(e[1] for e in afters) - last_up),
            'after': sum(e[2] - e[1] for e in afters)}


def _client_data(count: int, examples: int):
  import collections

  import numpy as np
  import tensorflow as tf
  rng = np.random.default_rng(0)
  data = []
  for _ in range(count):
    x = rng.normal(size=(examples, INPUT_DIM)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(examples, 1)).astype(np.int32)
    data.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(examples))
  return data


def _fed_avg(hidden: int, clients_per_round: int):
  import collections

  import tensorflow as tf
  import tensorflow_federated as tff

  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
  from dp_ftrl_tff.mechanisms import blt as blt_mechanisms

  spec = collections.OrderedDict(x=tf.TensorSpec([None, INPUT_DIM], tf.float32),
                                 y=tf.TensorSpec([None, 1], tf.int32))

  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(INPUT_DIM,)),
        tf.keras.layers.Dense(hidden, activation='relu'),
        tf.keras.layers.Dense(hidden, activation='relu'),
        tf.keras.layers.Dense(CLASSES)])
    return tff.learning.models.from_keras_model(
        keras_model, input_spec=spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

  strategy = blt_mechanisms.BLTStrategy(theta=(0.99, 0.8), omega=(0.25, 0.2))
  aggregator = CorrelatedNoiseFactory.blt(NOISE_MULTIPLIER, clients_per_round, CLIP,
                                          strategy=strategy, noise_seed=1)
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.01),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
      model_aggregator=aggregator)
  return process, process.initialize()


def run_child(spec: dict) -> None:
  """Measures every (model size, clients) setting for one worker count; prints RESULT lines."""
  from dp_ftrl_tff.learning import worker_processes
  from experiments.cli import flag_parsing
  flag_parsing.end_workers_at_exit()
  count = spec['workers']
  clock = None
  if count:
    from dp_ftrl_tff.learning import remote_contexts
    remote_contexts.set_remote_execution_context(spec['addresses'][:count])
    clock = _PhaseClock()
  worker_pids = spec['worker_pids'][:count]
  data = _client_data(max(spec['clients']), spec['examples'])
  for params in spec['params']:
    hidden = hidden_width(params)
    build = harness.timed(lambda h=hidden: _fed_avg(h, max(spec['clients'])))
    process, state, build_seconds = build.value[0], build.value[1], build.wall
    if not count:  # the local context's worker exists once a computation ran
      worker_pids = worker_processes.child_worker_pids(os.getpid())
    for clients in spec['clients']:
      if clients * params > spec['max_client_params']:
        continue
      rounds = []
      # One warm-up round per model (it compiles); later client counts reuse the compiled form.
      warmup = clients == min(c for c in spec['clients'] if c * params <= spec['max_client_params'])
      for _ in range(spec['rounds'] + warmup):
        workers_cpu = tff_rounds.cpu_seconds(worker_pids)
        timing = harness.timed(lambda p=process, s=state, c=clients: p.next(s, data[:c]))
        state = timing.value.state
        rounds.append({'wall': timing.wall, 'cpu': timing.cpu,
                       'workers_cpu': tff_rounds.cpu_seconds(worker_pids) - workers_cpu,
                       **(clock.phases() if clock else {})})
      result = {'workers': count, 'params': params, 'weights': weight_count(hidden),
                'clients': clients, 'build_seconds': build_seconds,
                # Peaks so far in this child (settings run by growing size).
                'workers_peak_mib': tff_rounds.peak_mib(worker_pids),
                'driver_peak_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                'warmup_seconds': rounds[0]['wall'] if warmup else None,
                'rounds': rounds[1:] if warmup else rounds}
      print('RESULT ' + json.dumps(result), flush=True)
