"""The mechanism core's speed targets in one run.

Prints wall time and loss for:
  * BLT optimize, n=2052, b=342, k=6, 4 buffers, MaxLoss (BLT paper Table 3 setting; target < 10 s);
  * BLT optimize, n=2000, b=400, k=ceil(n/b), MaxLoss, buffers chosen from 1..8 (target < 10 s; the
    jax_privacy optimizer took 112 s on this machine type);
  * BandMF optimize, n=2052, 342 bands, b=342, k=6, RmsLoss (target < 2 min; a dense BandMF optimizer
    took 41 min on this machine type);
  * exact tree sensitivity, n=2000, k=6, b=314 (target < 1 s; TF-Privacy's DP took 250 s).

  .venv/bin/python -m experiments.benchmarks.mechanisms_bench [--skip_banded]
"""

import time

from absl import app, flags

from dp_ftrl_tff.mechanisms import banded_optimizer, blt, tree
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_SKIP_BANDED = flags.DEFINE_bool('skip_banded', False, 'Skip the (longest) BandMF case.', flag_values=FLAGS)


def _timed(fn):
  start = time.perf_counter()
  value = fn()
  return time.perf_counter() - start, value


def main(argv):
  del argv
  table3 = ParticipationSchema.b_min_sep(342, 6)
  rows = []

  seconds, result = _timed(lambda: blt.optimize_blt(2052, table3, num_buffers=4, error='max'))
  rows.append(('BLT optimize n=2052 b=342 k=6 d=4', seconds, 10.0,
               f'MaxLoss {result.losses.max_loss:.4f} RmsLoss {result.losses.rms_loss:.4f} '
               '(paper 10.79)'))

  seconds, result = _timed(
      lambda: blt.optimize_blt(2000, ParticipationSchema.b_min_sep(400), error='max'))
  rows.append(('BLT optimize n=2000 b=400 k=None d=auto', seconds, 10.0,
               f'd={result.strategy.num_buffers} MaxLoss {result.losses.max_loss:.4f}'))

  if not _SKIP_BANDED.value:
    seconds, result = _timed(lambda: banded_optimizer.optimize_banded(2052, 342, table3, error='rms'))
    rows.append(('BandMF optimize n=2052 bands=342', seconds, 120.0,
                 f'MaxLoss {result.losses.max_loss:.4f} RmsLoss {result.losses.rms_loss:.4f} '
                 '(paper 10.21 / 8.60)'))

  seconds, value = _timed(lambda: tree.tree_sensitivity_squared(
      2000, ParticipationSchema.b_min_sep(314, 6)))
  rows.append(('tree sensitivity n=2000 k=6 b=314', seconds, 1.0,
               f'sens^2 {value} (TF-Privacy: 79 in 250 s)'))

  print(f"{'case':42s} {'seconds':>9s} {'target':>8s}  result")
  for name, seconds, target, text in rows:
    verdict = 'ok' if seconds < target else 'SLOW'
    print(f'{name:42s} {seconds:9.2f} {target:7.0f}s  {text} [{verdict}]', flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
