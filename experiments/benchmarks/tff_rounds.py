"""Timing TFF rounds, shared by the aggregator and FedAvg benchmarks (`aggregator_bench`,
`fedavg_bench`) and the workers benchmark's child (`workers_bench_child`).

A parent runs child processes (`run_children`: per repeat, one child per configuration, or one child
holding every configuration whose rounds go round-robin); a child times its rounds (`time_rounds`)
and prints `RESULT <json list>`; the parent prints the medians over the repeats and every ratio of
ours to the anchors measured in the same run (`print_summary`). Units: seconds per round, CPU
seconds = user + system of this process and its TFF `worker_binary` children, memory in MiB.
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
from typing import Iterable

from dp_ftrl_tff.learning import worker_processes
from experiments.benchmarks import harness

ANCHORS = ('tff_gaussian', 'tff_tree')
#: The issue-16 target pairs (ours, anchor): at most 1.05x.
TARGET_PAIRS = (('ours_gaussian', 'tff_gaussian'), ('ours_blt', 'tff_gaussian'),
                ('ours_banded', 'tff_gaussian'), ('ours_tree', 'tff_tree'))
TARGET_RATIO = 1.05
#: Rounds the benchmarks' banded strategy is built for (they run far fewer).
BANDED_ROUNDS = 2048
#: Its Toeplitz band coefficients: the first 3 of the square root of the prefix-sum matrix (BSR),
#: so the state holds 2 model-sized buffers, as the 2-buffer BLT does.
BANDED_COEFS = (1.0, 0.5, 0.375)


def cpu_seconds(pids: Iterable[int]) -> float:
  """User + system CPU seconds of the processes `pids` (a process that is gone counts 0)."""
  ticks = 0
  for pid in pids:
    try:
      with open(f'/proc/{pid}/stat', 'rb') as f:
        fields = f.read().decode(errors='replace').rsplit(')', 1)[1].split()
      ticks += int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
      continue
  return ticks / os.sysconf('SC_CLK_TCK')


def peak_mib(pids: Iterable[int]) -> float:
  """The sum of the processes' peak resident memory so far (VmHWM), in MiB."""
  kib = 0
  for pid in pids:
    try:
      with open(f'/proc/{pid}/status') as f:
        kib += next((int(line.split()[1]) for line in f if line.startswith('VmHWM:')), 0)
    except (OSError, ValueError):
      continue
  return kib / 1024


def settle_garbage_collector() -> None:
  """Collects, then freezes the heap, so that no full collection of the TF / TFF heap (0.2-0.3 s
  here, triggered by allocation counts, i.e. by how much tracing ran before) lands in the timed
  rounds of one configuration and not another."""
  gc.collect()
  gc.freeze()


def time_rounds(runs: list, rounds: int, round_data) -> list:
  """Times `rounds` rounds of every run in this process, round-robin (one round of each in turn, in
  a new random order each round), so that all of them see the same load.

  `runs`: dicts with 'name', 'process', 'state' (after the warm-up), 'build_seconds' and
  'warmup_seconds'; `round_data(r)`: the client data of timed round r (0-based). Per run: median
  wall seconds, CPU seconds per round (this process + its TFF workers, read around each call), and
  peak memory (this process + its worker's high-water marks, MiB) only when there is one run.
  """
  workers = worker_processes.child_worker_pids(os.getpid())

  def cpu_now():
    return time.process_time() + cpu_seconds(workers)

  for run in runs:
    run.update(times=[], cpu=0.0)
  # A round's time depends on which computation the worker ran just before (up to +-7% at 1e3 x 100
  # in a fixed order), so every round takes the runs in a new order (seeded: reproducible).
  order = random.Random(0)
  settle_garbage_collector()
  for r in range(rounds):
    for run in order.sample(runs, len(runs)):
      cpu_start = cpu_now()
      timing = harness.timed(lambda run=run, r=r: run['process'].next(run['state'], round_data(r)))
      run['state'] = timing.value.state
      run['times'].append(timing.wall)
      run['cpu'] += cpu_now() - cpu_start
  own_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  worker_mib = peak_mib(worker_processes.child_worker_pids(os.getpid()))
  alone = len(runs) == 1
  return [{'name': run['name'], 'round_seconds': statistics.median(run['times']),
           'round_times': run['times'], 'cpu_seconds': run['cpu'] / rounds,
           'warmup_seconds': run['warmup_seconds'], 'build_seconds': run['build_seconds'],
           'peak_mib': own_mib + worker_mib if alone else float('nan'),
           'worker_peak_mib': worker_mib if alone else float('nan')}
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
      ratios = {key: harness.ratio(summary[ours][key], summary[anchor][key])
                for key in ('round_seconds', 'cpu_seconds', 'peak_mib')}
      memory = ('' if math.isnan(ratios['peak_mib'])
                else f', peak memory {ratios["peak_mib"]:.3f}')
      print(f' {mark} {ours} / {anchor}: time {ratios["round_seconds"]:.3f}, '
            f'cpu {ratios["cpu_seconds"]:.3f}{memory}')
  return summary
