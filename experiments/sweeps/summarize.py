"""Summary of finished runs: `python -m experiments.sweeps.summarize ROOT [--output_dir=DIR]
[--metric=NAME]`.

Reads the `summary.json` of every run directory directly under ROOT (a sweep's root, see
`experiments.sweeps.run_sweep`; any `--root_output_dir` of the drivers works) and writes into
`--output_dir` (default ROOT):
  * `runs.csv` and `runs.md`: one row per finished run: the swept hyperparameters (the settings
    that differ between the runs), rounds, epsilon and delta (the privacy report's headline:
    observed participation, no amplification), the accounted noise multiplier, the final metrics
    and the training wall time (`experiments.sweeps.run_table`);
  * `accuracy_vs_epsilon.png`: `--metric` (default `eval_<the task's accuracy metric>`) against
    epsilon, one line per combination of the swept settings other than the noise's.
Unfinished run directories (no `summary.json` yet) are listed on stderr and left out. Errors are one
line on stderr: exit status 2 for bad input (ROOT not a directory, a metric no run has), 1 when no run
under ROOT has finished or a file cannot be read or written. Imports no TensorFlow.
"""

import os
import sys

from absl import app, flags

from dp_ftrl_tff.training import run_dir
from experiments.cli import flag_parsing
from experiments.sweeps import run_table

FLAGS = flags.FlagValues()
flags.DEFINE_string('output_dir', None, 'Where to write runs.csv, runs.md and '
                    'accuracy_vs_epsilon.png (default: ROOT).', flag_values=FLAGS)
flags.DEFINE_string('metric', None, 'The plotted final metric (default: eval_<accuracy metric of '
                    'the task>, e.g. eval_accuracy).', flag_values=FLAGS)

CSV_FILE = 'runs.csv'
MARKDOWN_FILE = 'runs.md'
PLOT_FILE = 'accuracy_vs_epsilon.png'


def main(argv) -> None:
  if len(argv) != 2:
    flag_parsing.exit_with_error('give exactly one ROOT directory (usage: python -m '
                                 'experiments.sweeps.summarize ROOT [--output_dir=DIR])', FLAGS)
  root = argv[1]
  try:
    runs = run_table.collect_runs(root)
  except ValueError as error:
    flag_parsing.exit_with_error(error, FLAGS)
  except run_dir.RunDirError as error:
    flag_parsing.exit_with_error(error, FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  if runs['unfinished']:
    print(f'summarize: {len(runs["unfinished"])} unfinished run(s) left out: '
          f'{", ".join(runs["unfinished"])}', file=sys.stderr)
  if not runs['finished']:
    flag_parsing.exit_with_error(f'no finished run (summary.json) under {root}', FLAGS,
                                 flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  finished = runs['finished']
  metric = FLAGS.metric or run_table.default_metric(finished)
  table = run_table.build_table(finished)
  if metric not in table['columns']:
    flag_parsing.exit_with_error(
        f'`metric` {metric!r} is not a final metric of these runs; choose one of '
        f'{[c for c in table["columns"] if c.startswith(("eval_", "train_"))]}', FLAGS)
  output_dir = FLAGS.output_dir or root
  paths = [os.path.join(output_dir, name) for name in (CSV_FILE, MARKDOWN_FILE, PLOT_FILE)]
  try:
    os.makedirs(output_dir, exist_ok=True)
    run_table.write_csv(table, paths[0])
    run_table.write_markdown(table, paths[1], note=(
        'epsilon: the privacy report\'s headline (observed participation, no amplification; '
        '"<= e" where it is the zCDP conversion bound, an upper bound from rho-zCDP); '
        'train_seconds: the sum of the rounds\' wall times.'))
    plotted = run_table.plot_accuracy_vs_epsilon(table, metric, paths[2])
  except ValueError as error:
    flag_parsing.exit_with_error(error, FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  except OSError as error:
    flag_parsing.exit_with_error(f'I/O error ({error.filename}): {error.strerror or error}', FLAGS,
                                 flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  print(f'{len(finished)} finished run(s); swept: {", ".join(table["swept"]) or "nothing"}; '
        f'{plotted} plotted')
  for path in paths:
    print(path)


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
