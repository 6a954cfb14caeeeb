r"""The round time of a driver run with canary clients, against the same run without them.

  .venv/bin/python -m experiments.benchmarks.canary_bench [--canary_clients=200] [--rounds=12] \
      [--mechanisms=gaussian,tree,banded,blt] [--repeats=2]

For each mechanism, runs the EMNIST synthetic demo (configs/demo.cfg: tiny model, 1000 clients, 50
per round) as a fresh subprocess without and with `--canary_clients`, alternating (so that load on
a shared machine hits both alike), `--repeats` times each, and prints the median round time
(`round_seconds` of metrics.csv over rounds 2 .. n: round 1 includes TFF's tracing) with and
without canaries and their ratio (the anchor is the run without canaries, measured in the same
invocation). Target: a ratio of at most 1.15.
"""

import csv
import os
import statistics
import subprocess
import sys
import tempfile

from absl import flags

from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_CANARIES = flags.DEFINE_integer('canary_clients', 200, 'Canary clients of the runs with canaries.',
                                 flag_values=FLAGS, lower_bound=1)
_ROUNDS = flags.DEFINE_integer('rounds', 12, 'Rounds per run.', flag_values=FLAGS, lower_bound=2)
_REPEATS = harness.define_repeats(FLAGS, 2, 'Runs of each configuration.')
_MECHANISMS = flags.DEFINE_list('mechanisms', ['gaussian', 'tree', 'banded', 'blt'],
                                'Mechanisms to time.', flag_values=FLAGS)

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _round_seconds(root: str, name: str, mechanism: str, canaries: int) -> float:
  """The median round time (s) of rounds 2 .. n of one fresh driver run."""
  args = [sys.executable, '-m', 'experiments.emnist.run_emnist', '--flagfile=configs/demo.cfg',
          f'--root_output_dir={root}', f'--experiment_name={name}', f'--mechanism={mechanism}',
          f'--rounds={_ROUNDS.value}', f'--canary_clients={canaries}', '--eval_every=1000',
          '--checkpoint_every=1000']
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.run(args, cwd=_ROOT, env=env, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f'{" ".join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}')
  with open(os.path.join(root, name, 'metrics.csv'), newline='') as f:
    times = [float(row['round_seconds']) for row in csv.DictReader(f)]
  return statistics.median(times[1:])


def main(argv):
  del argv
  print(f'{harness.conditions()}; the anchor of each mechanism: its runs without canaries')
  print(f'{"mechanism":<10} {"without (s)":>12} {"with (s)":>10} {"ratio":>7}')
  with tempfile.TemporaryDirectory() as root:
    for mechanism in _MECHANISMS.value:
      times = {0: [], _CANARIES.value: []}
      for repeat in range(_REPEATS.value):
        for canaries in times:
          name = f'{mechanism}_{canaries}_{repeat}'
          times[canaries].append(_round_seconds(root, name, mechanism, canaries))
      without, with_canaries = (statistics.median(t) for t in times.values())
      print(f'{mechanism:<10} {without:>12.3f} {with_canaries:>10.3f} '
            f'{harness.ratio(with_canaries, without):>7.3f}', flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
