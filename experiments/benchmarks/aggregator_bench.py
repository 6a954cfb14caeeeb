r"""Per-round wall time and peak memory: our factories vs TFF's DifferentiallyPrivateFactory.

Each factory runs in its own child process (fresh TFF worker, so peak memory is its own) within one
invocation, in interleaved order; the parent prints the figures and the ratios ours / TFF:
gaussian vs `DifferentiallyPrivateFactory.gaussian_fixed`, tree and BLT vs `.tree_aggregation`
(efficient tree). Wall time is the median over the timed rounds (after one warm-up round); peak
memory is the high-water resident set (VmHWM) of the child's TFF `worker_binary` plus the child's
own peak RSS (client data lives in both).

  tools/in_session.sh .venv/bin/python -m experiments.benchmarks.aggregator_bench \
      --dim=4000000 --clients=100 --rounds=3
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

from experiments import flag_parsing

FLAGS = flags.FlagValues()
_DIM = flags.DEFINE_integer('dim', 4_000_000, 'Parameters in the model update.', flag_values=FLAGS)
_CLIENTS = flags.DEFINE_integer('clients', 100, 'Clients per round.', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds (after one warm-up round).', flag_values=FLAGS)
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Child runs per factory (interleaved).', flag_values=FLAGS)
_FACTORIES = flags.DEFINE_list(
    'factories', ['tff_gaussian', 'ours_gaussian', 'tff_tree', 'ours_tree', 'ours_blt'],
    'Factories to measure.', flag_values=FLAGS)
_CHILD = flags.DEFINE_string('child', None, 'Internal: measure one factory and print JSON.', flag_values=FLAGS)

PAIRS = (('ours_gaussian', 'tff_gaussian'), ('ours_tree', 'tff_tree'), ('ours_blt', 'tff_tree'))
NOISE_MULTIPLIER = 1.0
CLIP = 1.0


def _make_factory(name, dim, clients):
  import tensorflow as tf
  import tensorflow_federated as tff

  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
  from dp_ftrl_tff.mechanisms import blt as blt_mechanisms

  if name == 'tff_gaussian':
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(NOISE_MULTIPLIER, clients,
                                                                       CLIP)
  if name == 'tff_tree':
    return tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
        NOISE_MULTIPLIER, clients, CLIP, record_specs=tf.TensorSpec([dim], tf.float32),
        noise_seed=1, use_efficient=True)
  if name == 'ours_gaussian':
    return CorrelatedNoiseFactory.gaussian(NOISE_MULTIPLIER, clients, CLIP, noise_seed=1)
  if name == 'ours_tree':
    return CorrelatedNoiseFactory.tree(NOISE_MULTIPLIER, clients, CLIP, use_efficient=True,
                                       noise_seed=1)
  if name == 'ours_blt':
    # A 2-buffer BLT of the size the BLT paper uses for ~2000 rounds (App. A scale).
    strategy = blt_mechanisms.BLTStrategy(theta=(0.99, 0.8), omega=(0.25, 0.2))
    return CorrelatedNoiseFactory.blt(NOISE_MULTIPLIER, clients, CLIP, strategy=strategy,
                                      noise_seed=1)
  raise ValueError(f'Unknown factory {name!r}.')


def _worker_peak_kib() -> int:
  """VmHWM (KiB) of this process's worker_binary children."""
  total = 0
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        ppid = int(f.read().rsplit(')', 1)[1].split()[1])
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        cmdline = f.read()
      if ppid != os.getpid() or b'worker_binary' not in cmdline:
        continue
      with open(f'/proc/{entry}/status') as f:
        for line in f:
          if line.startswith('VmHWM:'):
            total += int(line.split()[1])
    except (OSError, IndexError, ValueError):
      continue
  return total


def _measure(name, dim, clients, rounds) -> dict:
  import numpy as np
  import tensorflow_federated as tff

  from experiments import tff_workers
  tff_workers.register_at_exit()
  start = time.perf_counter()
  process = _make_factory(name, dim, clients).create(tff.TensorType(np.float32, [dim]))
  build_seconds = time.perf_counter() - start
  rng = np.random.default_rng(0)
  values = [rng.normal(scale=0.01, size=dim).astype(np.float32) for _ in range(clients)]
  state = process.initialize()
  times = []
  for _ in range(rounds + 1):
    start = time.perf_counter()
    output = process.next(state, values)
    state = output.state
    times.append(time.perf_counter() - start)
  own_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  worker_kib = _worker_peak_kib()
  return {'name': name, 'round_seconds': statistics.median(times[1:]), 'warmup_seconds': times[0],
          'build_seconds': build_seconds, 'peak_mib': (own_kib + worker_kib) / 1024,
          'worker_peak_mib': worker_kib / 1024}


def main(argv):
  del argv
  if _CHILD.value:
    print('RESULT ' + json.dumps(_measure(_CHILD.value, _DIM.value, _CLIENTS.value,
                                          _ROUNDS.value)), flush=True)
    return
  results = {}
  for _ in range(_REPEATS.value):
    for name in _FACTORIES.value:
      cmd = [sys.executable, '-m', 'experiments.benchmarks.aggregator_bench', f'--child={name}',
             f'--dim={_DIM.value}', f'--clients={_CLIENTS.value}', f'--rounds={_ROUNDS.value}']
      out = subprocess.run(cmd, capture_output=True, text=True, check=False)
      lines = [line for line in out.stdout.splitlines() if line.startswith('RESULT ')]
      if not lines:
        print(f'{name}: failed\n{out.stderr[-3000:]}', file=sys.stderr)
        continue
      result = json.loads(lines[-1][len('RESULT '):])
      print(f'{name}: {json.dumps(result)}', flush=True)
      results.setdefault(name, []).append(result)
  print(f'dim={_DIM.value} clients={_CLIENTS.value} timed rounds={_ROUNDS.value} '
        f'repeats={_REPEATS.value}')
  print(f'{"factory":<15}{"round s":>10}{"peak MiB":>11}{"build s":>9}')
  summary = {}
  for name, runs in results.items():
    summary[name] = {
        'round_seconds': statistics.median(r['round_seconds'] for r in runs),
        'peak_mib': statistics.median(r['peak_mib'] for r in runs),
        'build_seconds': statistics.median(r['build_seconds'] for r in runs)}
    s = summary[name]
    print(f'{name:<15}{s["round_seconds"]:>10.3f}{s["peak_mib"]:>11.0f}{s["build_seconds"]:>9.1f}')
  print('ratios (ours / TFF; target <= 1.1):')
  for ours, theirs in PAIRS:
    if ours in summary and theirs in summary:
      time_ratio = summary[ours]['round_seconds'] / summary[theirs]['round_seconds']
      mem_ratio = summary[ours]['peak_mib'] / summary[theirs]['peak_mib']
      print(f'  {ours} / {theirs}: time {time_ratio:.3f}, peak memory {mem_ratio:.3f}')


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
