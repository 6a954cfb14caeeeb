r"""How fast the binaries answer `--help` and a flag error, against importing TensorFlow.

  .venv/bin/python -m experiments.benchmarks.startup_bench [--repeats=5]

Runs each command `--repeats` times as a fresh subprocess (interleaved, so that load on a shared
machine hits every command alike) and prints the median and the range of its wall time, and the
median's ratio to the anchor measured in the same run: `python -c "import tensorflow"`, what every
answer cost before the binaries checked their flags before importing TensorFlow. Target: each
`--help` and flag error under 1.5 s on a 2-core machine.
"""

import os
import statistics
import subprocess
import sys

from absl import flags

from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_REPEATS = harness.define_repeats(FLAGS, 5, 'Runs of each command.')

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: (label, arguments of `python`, expected exit status).
COMMANDS = [
    ('anchor: import tensorflow', ['-c', 'import tensorflow'], 0),
    ('run_emnist --help', ['-m', 'experiments.emnist.run_emnist', '--help'], 0),
    ('run_emnist --rounds=x', ['-m', 'experiments.emnist.run_emnist', '--rounds=x'], 2),
    ('run_stackoverflow --help', ['-m', 'experiments.stackoverflow.run_stackoverflow', '--help'], 0),
    ('run_stackoverflow --clients_per_round=0',
     ['-m', 'experiments.stackoverflow.run_stackoverflow', '--root_output_dir=/nonexistent',
      '--clients_per_round=0'], 2),
    ('privacy_report --help', ['-m', 'experiments.privacy_report', '--help'], 0),
    ('privacy_report --rounds=-1', ['-m', 'experiments.privacy_report', '--rounds=-1'], 2),
    ('mechanisms --help', ['-m', 'experiments.mechanisms_cli', '--help'], 0),
    ('mechanisms optimize --bogus=1', ['-m', 'experiments.mechanisms_cli', 'optimize', '--bogus=1'], 2),
]


def _seconds(args, exit_code) -> float:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  timing = harness.timed(lambda: subprocess.run(
      [sys.executable, *args], cwd=_ROOT, env=env, stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL, check=False))
  if timing.value.returncode != exit_code:
    raise RuntimeError(f'python {" ".join(args)} exited {timing.value.returncode}, not {exit_code}')
  return timing.wall


def main(argv):
  del argv
  times = {label: [] for label, _, _ in COMMANDS}
  for _ in range(_REPEATS.value):
    for label, args, exit_code in COMMANDS:
      times[label].append(_seconds(args, exit_code))
  anchor = statistics.median(times[COMMANDS[0][0]])
  print(f'{harness.conditions()}, {_REPEATS.value} runs each')
  print(f'{"command":42s} {"median s":>9s} {"range s":>13s} {"/ anchor":>9s}')
  medians = {label: statistics.median(values) for label, values in times.items()}
  for label, values in times.items():
    print(f'{label:42s} {medians[label]:9.2f} {min(values):6.2f}-{max(values):<6.2f} '
          f'{harness.ratio(medians[label], anchor):9.2f}')
  ours = {label: median for label, median in medians.items() if label != COMMANDS[0][0]}
  ratios = [harness.ratio(median, anchor) for median in ours.values()]
  print(harness.benchmarks_row(
      f'`--help` and a flag error of the binaries, {_REPEATS.value} runs each',
      'medians: ' + ', '.join(f'{label} {median:.2f} s' for label, median in ours.items()),
      f'`python -c "import tensorflow"`, same run: {anchor:.2f} s median',
      f'{min(ratios):.2f}-{max(ratios):.2f} of the anchor; < 1.5 s: '
      f'{"met" if max(ours.values()) < 1.5 else "not met"}',
      f'startup_bench --repeats={_REPEATS.value}'))


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
