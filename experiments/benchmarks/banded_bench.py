"""Times the general BandMF optimizer (`optimize_banded`) against an anchor optimizer, with losses.

Setting per n: 342 bands (min(342, n); 342 at every default n), min_sep = 342, k = 6 participations
(k_eff = min(6, ceil(n / 342))), prefix-sum workload, defaults of `optimize_banded` (100 L-BFGS
iterations per stage, default tolerances). At n = 2052 this is the StackOverflow setting of the BandMF
and BLT papers (BLT paper Table 3 BandMF row: MaxLoss 10.21, RmsLoss 8.60, headers swapped in print).

Anchor, run end to end in the same process on the same machine: `optimize_banded` of another
version of dp_ftrl_tff/mechanisms/banded.py, read from `--anchor_module` (a file path) or else with
`git show` from `--anchor_commit` (default a40bbfe: the single-stage O(n b-hat^2) optimizer the current one
started from, Toeplitz warm start, p = 64 smooth maximum). Each line gives CPU seconds
(`time.process_time`, all threads of this process) and wall seconds of one `optimize_banded` call,
MaxLoss and RmsLoss, and the anchor / ours ratios. CPU seconds are the comparable figure on a shared
machine: waiting for a core inflates wall time only, but OpenBLAS threads that spin while the other
core is busy inflate both (set OPENBLAS_NUM_THREADS=1 to measure without that).
`--repeats=N` also times N objective + gradient evaluations of both at one point (the
'max' values differ when the smooth-maximum power differs).

  .venv/bin/python -m experiments.benchmarks.banded_bench [--num_rounds=512,2052,8192 \
      --errors=rms,max --anchor_module=/tmp/banded_anchor.py --noanchor_full]
"""

import importlib.util
import os
import subprocess
import tempfile

from absl import flags

from dp_ftrl_tff.mechanisms import banded, banded_optimizer
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments.benchmarks import harness
from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_NUM_ROUNDS = flags.DEFINE_list('num_rounds', ['512', '2052', '8192'], 'Values of n.', flag_values=FLAGS)
_NUM_BANDS = flags.DEFINE_integer('num_bands', 342, 'Bands b-hat (min(b-hat, n) is used).',
                                  flag_values=FLAGS)
_MIN_SEP = flags.DEFINE_integer('min_sep', 342, 'b (rounds between participations + 1).', flag_values=FLAGS)
_MAX_PARTICIPATIONS = flags.DEFINE_integer('max_participations', 6, 'k.', flag_values=FLAGS)
_ERRORS = flags.DEFINE_list('errors', ['rms', 'max'], 'Optimized errors (rms, max).', flag_values=FLAGS)
_ANCHOR_MODULE = flags.DEFINE_string('anchor_module', '',
                                     'Path of the anchor banded.py (takes precedence over --anchor_commit).',
                                     flag_values=FLAGS)
_ANCHOR_COMMIT = flags.DEFINE_string('anchor_commit', 'a40bbfe',
                                     'Commit whose banded.py is the anchor when --anchor_module is empty.',
                                     flag_values=FLAGS)
_ANCHOR_FULL = flags.DEFINE_bool('anchor_full', True, 'Run the anchor optimizer end to end.',
                                 flag_values=FLAGS)
_EVALUATION_REPEATS = harness.define_repeats(
    FLAGS, 0, 'Timed objective evaluations per objective (median); 0: none.', lower_bound=0)

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(path: str, name: str):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _anchor_module():
  """The anchor banded.py, imported as a stand-alone module, and a description of its source."""
  if _ANCHOR_MODULE.value:
    if not os.path.isfile(_ANCHOR_MODULE.value):
      raise RuntimeError(f'--anchor_module: no file {_ANCHOR_MODULE.value!r}')
    return _load(_ANCHOR_MODULE.value, 'banded_anchor'), _ANCHOR_MODULE.value
  commit = _ANCHOR_COMMIT.value
  source = subprocess.run(['git', 'show', f'{commit}:dp_ftrl_tff/mechanisms/banded.py'],
                          cwd=_REPOSITORY, capture_output=True, text=True, check=False)
  if source.returncode != 0:
    raise RuntimeError(f'cannot read the anchor at commit {commit!r}: '
                       f'{source.stderr.strip() or "git show failed"}')
  path = os.path.join(tempfile.mkdtemp(prefix='banded_anchor_'), 'banded_anchor.py')
  with open(path, 'w') as f:
    f.write(source.stdout)
  return _load(path, 'banded_anchor'), f'commit {commit}'


def _evaluation_seconds(module, num_rounds: int, num_bands: int, error: str) -> tuple:
  """(median wall seconds, median CPU seconds, value) of one objective + gradient evaluation."""
  objective = module._BandedObjective(num_rounds, num_bands, module._Workload(num_rounds, None), error)  # pylint: disable=protected-access
  start = banded.BandedStrategy.from_toeplitz(banded.fhu_coefficients(num_bands), num_rounds)
  params = objective.params_from_matrix(start.strategy_matrix(num_rounds))
  timing = harness.median_of(lambda: objective.value_and_grad(params)[0],
                             _EVALUATION_REPEATS.value)
  return timing.wall, timing.cpu, timing.value


def _optimize(module, num_rounds: int, num_bands: int, participation, error: str) -> tuple:
  """(wall s, CPU s, result) of one `optimize_banded` call with its defaults."""
  timing = harness.timed(
      lambda: module.optimize_banded(num_rounds, num_bands, participation, error=error))
  return timing.wall, timing.cpu, timing.value


def _stages(result) -> str:
  """'n/bands:evaluations' per stage ('levels' in our details; the anchor has one stage) and the
  last stage's stopping message."""
  levels = result.details.get('levels') or [result.details['banded_stage']]
  return ' '.join(f'{level.get("num_rounds", "")}/{level.get("num_bands", "")}:'
                  f'{level["evaluations"]}' for level in levels) + f' ({levels[-1]["message"]})'



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
    anchor, anchor_source = _anchor_module()
  except RuntimeError as e:
    flag_parsing.exit_with_error(e, FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  try:
    participation = ParticipationSchema.b_min_sep(_MIN_SEP.value, _MAX_PARTICIPATIONS.value)
    for n in sizes:
      banded_optimizer.optimize_banded(n, min(_NUM_BANDS.value, n), participation, max_iterations=1,
                             toeplitz=True)
  except ValueError as e:  # bad --num_rounds / --num_bands / --min_sep / --max_participations
    flag_parsing.exit_with_error(e, FLAGS)
  print(f'anchor: {anchor_source}; {os.cpu_count()} CPUs; OPENBLAS_NUM_THREADS='
        f'{os.environ.get("OPENBLAS_NUM_THREADS", "unset")}; load average at start: '
        f'{os.getloadavg()[0]:.1f}', flush=True)
  for n in sizes:
    bands = min(_NUM_BANDS.value, n)
    for error in _ERRORS.value:
      if _EVALUATION_REPEATS.value:
        old_wall, old_cpu, old_value = _evaluation_seconds(anchor, n, bands, error)
        new_wall, new_cpu, new_value = _evaluation_seconds(banded, n, bands, error)
        print(f'n={n} {error}: one evaluation: anchor {old_wall:.3f} s (cpu {old_cpu:.3f}), ours '
              f'{new_wall:.3f} s (cpu {new_cpu:.3f}); ratio {harness.ratio(old_wall, new_wall):.1f}x wall, '
              f'{harness.ratio(old_cpu, new_cpu):.1f}x cpu; objective anchor {old_value:.12g} ours '
              f'{new_value:.12g}', flush=True)
      wall, cpu, result = _optimize(banded, n, bands, participation, error)
      print(f'n={n} bands={bands} {error}: ours cpu {cpu:.2f} s wall {wall:.2f} s, MaxLoss '
            f'{result.losses.max_loss:.4f} RmsLoss {result.losses.rms_loss:.4f} sens^2 '
            f'{result.losses.sensitivity_squared:.6f}; evaluations per stage {_stages(result)} '
            f'(load {os.getloadavg()[0]:.1f})', flush=True)
      if _ANCHOR_FULL.value:
        old_wall, old_cpu, old = _optimize(anchor, n, bands, participation, error)
        print(f'n={n} bands={bands} {error}: anchor cpu {old_cpu:.2f} s wall {old_wall:.2f} s, '
              f'MaxLoss {old.losses.max_loss:.4f} RmsLoss {old.losses.rms_loss:.4f}; evaluations '
              f'{_stages(old)}; anchor / ours: cpu {harness.ratio(old_cpu, cpu):.1f}x '
              f'wall {harness.ratio(old_wall, wall):.1f}x '
              f'(load {os.getloadavg()[0]:.1f})', flush=True)
  print(f'load average at end: {os.getloadavg()[0]:.1f}', flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
