r"""Per-round wall time, CPU time and peak memory: our factories vs TFF's DP factory.

The parent prints every ratio ours / anchor, the issue-16 target pairs marked with `*` (target
<= 1.05): gaussian, BLT (2 buffers) and banded (BandMF, 3 bands = 2 buffers) vs
`DifferentiallyPrivateFactory.gaussian_fixed`, the efficient tree vs `.tree_aggregation`
(efficient). Two ways to interleave (`--interleave`), each repeated `--repeats` times:
  * processes (default): each factory runs in its own child process (fresh TFF worker, so peak
    memory is its own), the children one after the other in the order of `--factories`;
  * rounds: one child builds every factory and runs their timed rounds round-robin (one round of
    each in turn, in a new random order each round, one shared worker), so that all factories see
    the same load from other jobs on a shared machine; no per-factory peak memory.
Per child and factory: one warm-up round, then the child collects garbage and freezes the heap
(`gc.freeze`, so that a full collection of the TF / TFF heap, 0.2-0.3 s triggered by allocation
counts, does not land in one factory's timed rounds only), then `--rounds` timed rounds. Wall time
is the median over the timed rounds; CPU time is the child's plus its TFF `worker_binary`'s user +
system CPU seconds per timed round (less sensitive than wall time to other jobs); peak memory is
the high-water resident set (VmHWM) of the worker plus the child's own peak RSS (client data lives
in both). Across repeats the parent takes medians. The header records the load average and any
glibc `MALLOC_*` tuning variable in the environment (the children and their workers inherit them;
docs/benchmarks/aggregators.md, "glibc malloc settings", measures their effect).

  tools/in_session.sh .venv/bin/python -m experiments.benchmarks.aggregator_bench \
      --dim=4000000 --clients=100 --rounds=3
  tools/in_session.sh nice -n 10 .venv/bin/python -m experiments.benchmarks.aggregator_bench \
      --dim=100000 --clients=10 --rounds=40 --repeats=3 --interleave=rounds
"""

import gc
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_DIM = flags.DEFINE_integer('dim', 4_000_000, 'Parameters in the model update.', lower_bound=1, flag_values=FLAGS)
_CLIENTS = flags.DEFINE_integer('clients', 100, 'Clients per round.', lower_bound=1, flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds (after one warm-up round).',
                               lower_bound=1, flag_values=FLAGS)
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Passes over --factories (see --interleave).',
                                lower_bound=1, flag_values=FLAGS)
FACTORY_NAMES = ('tff_gaussian', 'ours_gaussian', 'tff_tree', 'ours_tree', 'ours_blt', 'ours_banded')
_FACTORIES = flags.DEFINE_list(
    'factories', list(FACTORY_NAMES),
    'Factories to measure (tff_gaussian, tff_tree, ours_gaussian, ours_tree, ours_blt, '
    'ours_banded).', flag_values=FLAGS)
flags.register_validator(
    'factories', lambda names: bool(names) and set(names) <= set(FACTORY_NAMES),
    f'must be a non-empty comma-separated subset of {", ".join(FACTORY_NAMES)}', flag_values=FLAGS)
_INTERLEAVE = flags.DEFINE_enum(
    'interleave', 'processes', ['processes', 'rounds'],
    'processes: one child process per factory and repeat (per-factory peak memory); rounds: one '
    'child per repeat holding every factory, timed rounds round-robin over them (all see the same '
    'load; no per-factory peak memory).', flag_values=FLAGS)
_CHILD = flags.DEFINE_string('child', None, 'Internal: measure these factories, print JSON.',
                             flag_values=FLAGS)

ANCHORS = ('tff_gaussian', 'tff_tree')
#: The issue-16 target pairs (ours, anchor): at most 1.05x.
TARGET_PAIRS = (('ours_gaussian', 'tff_gaussian'), ('ours_blt', 'tff_gaussian'),
                ('ours_banded', 'tff_gaussian'), ('ours_tree', 'tff_tree'))
TARGET_RATIO = 1.05
NOISE_MULTIPLIER = 1.0
CLIP = 1.0
#: Rounds the banded strategy is built for (the benchmark runs far fewer).
BANDED_ROUNDS = 2048
#: Its Toeplitz band coefficients: the first 3 of the square root of the prefix-sum matrix (BSR),
#: so the state holds 2 model-sized buffers, as the 2-buffer BLT does.
BANDED_COEFS = (1.0, 0.5, 0.375)


def _make_factory(name, dim, clients):
  import tensorflow as tf
  import tensorflow_federated as tff

  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
  from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
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
  if name == 'ours_banded':
    strategy = banded_mechanisms.BandedStrategy.from_toeplitz(BANDED_COEFS, BANDED_ROUNDS)
    return CorrelatedNoiseFactory.banded(NOISE_MULTIPLIER, clients, CLIP, strategy=strategy,
                                         noise_seed=1)
  raise ValueError(f'Unknown factory {name!r}.')


def worker_peak_kib() -> int:
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


def settle_garbage_collector() -> None:
  """Collects, then freezes the heap, so that no full collection of the TF / TFF heap (0.2-0.3 s
  here, triggered by allocation counts, i.e. by how much tracing ran before) lands in the timed
  rounds of one configuration and not another."""
  gc.collect()
  gc.freeze()


def process_cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of process `pid` (0.0 if it is gone)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except (OSError, IndexError):
    return 0.0
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _measure(names, dim, clients, rounds) -> list:
  """Times `names` in this process: each factory's process runs one warm-up round, then the timed
  rounds go round-robin over the factories (one round each in turn), so that all of them see the
  same load. Per factory: median wall seconds, and CPU seconds per round (this process + its worker,
  read around each call). Peak memory is per factory only when `names` has one entry."""
  import numpy as np
  import tensorflow_federated as tff

  from experiments.cli import tff_workers
  tff_workers.register_at_exit()
  rng = np.random.default_rng(0)
  values = [rng.normal(scale=0.01, size=dim).astype(np.float32) for _ in range(clients)]
  runs = []
  for name in names:
    start = time.perf_counter()
    process = _make_factory(name, dim, clients).create(tff.TensorType(np.float32, [dim]))
    build_seconds = time.perf_counter() - start
    start = time.perf_counter()
    state = process.next(process.initialize(), values).state
    runs.append({'name': name, 'process': process, 'state': state,
                 'build_seconds': build_seconds, 'warmup_seconds': time.perf_counter() - start})
  return time_rounds(runs, rounds, lambda r: values)


def time_rounds(runs: list, rounds: int, round_data) -> list:
  """Times `rounds` rounds of every run in this process, round-robin (one round of each in turn, in
  a new random order each round), so that all of them see the same load.

  `runs`: dicts with 'name', 'process', 'state' (after the warm-up), 'build_seconds' and
  'warmup_seconds'; `round_data(r)`: the client data of timed round r (0-based). Per run: median
  wall seconds, CPU seconds per round (this process + its TFF workers, read around each call), and
  peak memory (this process + its worker's high-water marks, MiB) only when there is one run.
  """
  from experiments.cli import tff_workers
  workers = tff_workers.child_worker_pids(os.getpid())

  def cpu_now():
    return time.process_time() + sum(process_cpu_seconds(pid) for pid in workers)

  for run in runs:
    run.update(times=[], cpu=0.0)
  # A round's time depends on which computation the worker ran just before (up to +-7% at 1e3 x 100
  # in a fixed order), so every round takes the runs in a new order (seeded: reproducible).
  order = random.Random(0)
  settle_garbage_collector()
  for r in range(rounds):
    for run in order.sample(runs, len(runs)):
      cpu_start, start = cpu_now(), time.perf_counter()
      run['state'] = run['process'].next(run['state'], round_data(r)).state
      run['times'].append(time.perf_counter() - start)
      run['cpu'] += cpu_now() - cpu_start
  own_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  worker_kib = worker_peak_kib()
  alone = len(runs) == 1
  return [{'name': run['name'], 'round_seconds': statistics.median(run['times']),
           'round_times': run['times'], 'cpu_seconds': run['cpu'] / rounds,
           'warmup_seconds': run['warmup_seconds'], 'build_seconds': run['build_seconds'],
           'peak_mib': (own_kib + worker_kib) / 1024 if alone else float('nan'),
           'worker_peak_mib': worker_kib / 1024 if alone else float('nan')}
          for run in runs]


def run_children(child_command, names: list, repeats: int, interleave: str) -> dict:
  """The parent's loop: per repeat, one child per name (`interleave`='processes') or one child
  holding every name ('rounds'). `child_command(names)` is the child's command line; it prints
  `RESULT <json list>`. Prints each result; returns name -> the list of its results."""
  results = {}
  for _ in range(repeats):
    batches = [names] if interleave == 'rounds' else [[name] for name in names]
    for batch in batches:
      out = subprocess.run(child_command(batch), capture_output=True, text=True, check=False)
      lines = [line for line in out.stdout.splitlines() if line.startswith('RESULT ')]
      if not lines:
        print(f'{",".join(batch)}: failed\n{out.stderr[-3000:]}', file=sys.stderr)
        continue
      for result in json.loads(lines[-1][len('RESULT '):]):
        print(f'{result["name"]}: {json.dumps(result)}', flush=True)
        results.setdefault(result['name'], []).append(result)
  return results


def _child_command(names: list) -> list:
  return [sys.executable, '-m', 'experiments.benchmarks.aggregator_bench',
          f'--child={",".join(names)}', f'--dim={_DIM.value}', f'--clients={_CLIENTS.value}',
          f'--rounds={_ROUNDS.value}']


def main(argv):
  del argv
  if _CHILD.value:
    print('RESULT ' + json.dumps(_measure(_CHILD.value.split(','), _DIM.value, _CLIENTS.value,
                                          _ROUNDS.value)), flush=True)
    return
  results = run_children(_child_command, _FACTORIES.value, _REPEATS.value, _INTERLEAVE.value)
  print(f'dim={_DIM.value} clients={_CLIENTS.value} timed rounds={_ROUNDS.value} '
        f'repeats={_REPEATS.value} interleave={_INTERLEAVE.value} {run_conditions()}')
  print_summary(results)


def run_conditions() -> str:
  """'load average L' and the glibc `MALLOC_*` variables set in the environment, if any."""
  malloc = ' '.join(f'{name}={value}' for name, value in sorted(os.environ.items())
                    if name.startswith('MALLOC_'))
  return f'load average {os.getloadavg()[0]:.1f}' + (f' {malloc}' if malloc else '')


def print_summary(results: dict, anchors=ANCHORS, target_pairs=TARGET_PAIRS) -> dict:
  """Prints the medians over the repeats per name and every ratio ours_* / anchor; returns the
  medians. `results`: name -> list of child results (keys round_seconds, cpu_seconds, peak_mib,
  build_seconds)."""
  print(f'{"name":<15}{"round s":>10}{"cpu s":>10}{"peak MiB":>11}{"build s":>9}')
  summary = {}
  for name, runs in results.items():
    summary[name] = {key: statistics.median(r[key] for r in runs)
                     for key in ('round_seconds', 'cpu_seconds', 'peak_mib', 'build_seconds')}
    s = summary[name]
    print(f'{name:<15}{s["round_seconds"]:>10.4f}{s["cpu_seconds"]:>10.4f}{s["peak_mib"]:>11.0f}'
          f'{s["build_seconds"]:>9.1f}')
  print(f'ratios ours / anchor (* = issue-16 target pair, target <= {TARGET_RATIO}):')
  for ours in sorted(name for name in summary if name.startswith('ours_')):
    for anchor in anchors:
      if anchor not in summary:
        continue
      mark = '*' if (ours, anchor) in target_pairs else ' '
      ratios = {key: summary[ours][key] / summary[anchor][key]
                for key in ('round_seconds', 'cpu_seconds', 'peak_mib')}
      memory = ('' if math.isnan(ratios['peak_mib'])
                else f', peak memory {ratios["peak_mib"]:.3f}')
      print(f' {mark} {ours} / {anchor}: time {ratios["round_seconds"]:.3f}, '
            f'cpu {ratios["cpu_seconds"]:.3f}{memory}')
  return summary


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
