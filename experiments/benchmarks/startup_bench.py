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
import time

from absl import app, flags

from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Runs of each command.', flag_values=FLAGS,
                                lower_bound=1)

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
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, *args], cwd=_ROOT, env=env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, check=False)
  seconds = time.perf_counter() - start
  if proc.returncode != exit_code:
    raise RuntimeError(f'python {" ".join(args)} exited {proc.returncode}, not {exit_code}')
  return seconds


def main(argv):
  del argv
  times = {label: [] for label, _, _ in COMMANDS}
  for _ in range(_REPEATS.value):
    for label, args, exit_code in COMMANDS:
      times[label].append(_seconds(args, exit_code))
  anchor = statistics.median(times[COMMANDS[0][0]])
  print(f'load average {os.getloadavg()[0]:.1f}, {_REPEATS.value} runs each')
  print(f'{"command":42s} {"median s":>9s} {"range s":>13s} {"/ anchor":>9s}')
  for label, values in times.items():
    median = statistics.median(values)
    print(f'{label:42s} {median:9.2f} {min(values):6.2f}-{max(values):<6.2f} {median / anchor:9.2f}')


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
