"""Times the general BandMF optimizer against the previous O(b-hat n^2) objective, and its losses.

Setting per n: 342 bands, min_sep = 342, k = 6 participations (k_eff = min(6, ceil(n / 342))); at
n = 2052 this is the StackOverflow setting of the BandMF and BLT papers (BLT paper Table 3 BandMF row:
MaxLoss 10.21, RmsLoss 8.60, headers swapped in print).

Anchor, measured in the same run: the objective-and-gradient evaluation of the optimizer as of commit
`--anchor_commit` (it formed C^-1 and B densely, O(b-hat n^2) per evaluation), read with `git show`
into a temporary module and evaluated at the same starting point as ours. Both evaluate the same
function (their values are printed side by side); the ratio is the per-evaluation speed-up. The
optimizer itself is unchanged (same L-BFGS, same start, same iterations), so the anchor's projected
time for a run is its per-evaluation time times our evaluation count; `--anchor_full` also runs the
old optimizer end to end (about 1 minute at n = 2052 on an idle machine, 20+ minutes at n = 8192).

  .venv/bin/python -m experiments.benchmarks.banded_bench [--num_rounds=512,2052,8192 --errors=rms,max]
"""

import importlib.util
import os
import statistics
import subprocess
import tempfile
import time

from absl import app, flags

from dp_ftrl_tff.mechanisms import banded
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments import flag_parsing

FLAGS = flags.FlagValues()
_NUM_ROUNDS = flags.DEFINE_list('num_rounds', ['2052'], 'Values of n.', flag_values=FLAGS)
_NUM_BANDS = flags.DEFINE_integer('num_bands', 342, 'Bands b-hat.', flag_values=FLAGS)
_MIN_SEP = flags.DEFINE_integer('min_sep', 342, 'b (rounds between participations + 1).', flag_values=FLAGS)
_MAX_PARTICIPATIONS = flags.DEFINE_integer('max_participations', 6, 'k.', flag_values=FLAGS)
_MAX_ITERATIONS = flags.DEFINE_integer('max_iterations', 100, 'L-BFGS iterations per stage.', flag_values=FLAGS)
_ERRORS = flags.DEFINE_list('errors', ['rms', 'max'], 'Optimized errors (rms, max).', flag_values=FLAGS)
_ANCHOR_COMMIT = flags.DEFINE_string('anchor_commit', '337204f',
                                     'Commit whose banded.py objective is the anchor.', flag_values=FLAGS)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed evaluations per objective (median).', flag_values=FLAGS)
_ANCHOR_FULL = flags.DEFINE_bool('anchor_full', False, 'Also run the anchor optimizer end to end.',
                                 flag_values=FLAGS)

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _anchor_module(commit: str):
  """dp_ftrl_tff/mechanisms/banded.py at `commit`, imported as a stand-alone module."""
  source = subprocess.run(['git', 'show', f'{commit}:dp_ftrl_tff/mechanisms/banded.py'],
                          cwd=_REPOSITORY, capture_output=True, text=True, check=False)
  if source.returncode != 0:
    raise RuntimeError(f'cannot read the anchor at commit {commit!r}: '
                       f'{source.stderr.strip() or "git show failed"}')
  directory = tempfile.mkdtemp(prefix='banded_anchor_')
  path = os.path.join(directory, 'banded_anchor.py')
  with open(path, 'w') as f:
    f.write(source.stdout)
  spec = importlib.util.spec_from_file_location('banded_anchor', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _evaluation_seconds(module, num_rounds: int, num_bands: int, error: str) -> tuple:
  """(median wall seconds, median CPU seconds, value) of one objective + gradient evaluation."""
  objective = module._BandedObjective(num_rounds, num_bands, module._Workload(num_rounds, None), error)  # pylint: disable=protected-access
  start = banded.BandedStrategy.from_toeplitz(banded.fhu_coefficients(num_bands), num_rounds)
  params = objective.params_from_matrix(start.strategy_matrix(num_rounds))
  walls, cpus = [], []
  for _ in range(_REPEATS.value):
    wall, cpu = time.perf_counter(), time.process_time()
    value, _ = objective.value_and_grad(params)
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
  return statistics.median(walls), statistics.median(cpus), value


def _optimize(module, num_rounds: int, participation, error: str) -> tuple:
  wall, cpu = time.perf_counter(), time.process_time()
  result = module.optimize_banded(num_rounds, _NUM_BANDS.value, participation, error=error,
                                  max_iterations=_MAX_ITERATIONS.value)
  return time.perf_counter() - wall, time.process_time() - cpu, result


def main(argv):
  del argv
  try:
    sizes = [int(value) for value in _NUM_ROUNDS.value]
  except ValueError:
    flag_parsing.exit_with_error(ValueError(f'--num_rounds must be integers, got {_NUM_ROUNDS.value}'),
                                 FLAGS)
  for error in _ERRORS.value:
    if error not in ('rms', 'max'):
      flag_parsing.exit_with_error(ValueError(f'--errors: unknown error {error!r}'), FLAGS)
  try:
    anchor = _anchor_module(_ANCHOR_COMMIT.value)
  except RuntimeError as e:
    flag_parsing.exit_with_error(e, FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  try:
    participation = ParticipationSchema.b_min_sep(_MIN_SEP.value, _MAX_PARTICIPATIONS.value)
    for n in sizes:
      banded.optimize_banded(n, _NUM_BANDS.value, participation, max_iterations=1, toeplitz=True)
  except ValueError as e:  # bad --num_rounds / --num_bands / --min_sep / --max_participations
    flag_parsing.exit_with_error(e, FLAGS)
  print(f'load average at start: {os.getloadavg()[0]:.1f}', flush=True)
  for n in sizes:
    for error in _ERRORS.value:
      old_wall, old_cpu, old_value = _evaluation_seconds(anchor, n, _NUM_BANDS.value, error)
      new_wall, new_cpu, new_value = _evaluation_seconds(banded, n, _NUM_BANDS.value, error)
      print(f'n={n} {error}: one evaluation: anchor {old_wall:.3f} s (cpu {old_cpu:.3f}), ours '
            f'{new_wall:.3f} s (cpu {new_cpu:.3f}); ratio {old_wall / new_wall:.1f}x wall, '
            f'{old_cpu / new_cpu:.1f}x cpu; objective anchor {old_value:.12g} ours {new_value:.12g}',
            flush=True)
      wall, cpu, result = _optimize(banded, n, participation, error)
      evaluations = result.details['banded_stage']['evaluations']
      print(f'n={n} {error}: ours {wall:.1f} s (cpu {cpu:.1f} s), {evaluations} evaluations, '
            f'MaxLoss {result.losses.max_loss:.4f} RmsLoss {result.losses.rms_loss:.4f} '
            f'sens^2 {result.losses.sensitivity_squared:.6f}; anchor projected '
            f'{evaluations * old_wall:.1f} s', flush=True)
      if _ANCHOR_FULL.value:
        wall, cpu, old = _optimize(anchor, n, participation, error)
        print(f'n={n} {error}: anchor optimizer {wall:.1f} s (cpu {cpu:.1f} s), MaxLoss '
              f'{old.losses.max_loss:.4f} RmsLoss {old.losses.rms_loss:.4f}', flush=True)
  print(f'load average at end: {os.getloadavg()[0]:.1f}', flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
