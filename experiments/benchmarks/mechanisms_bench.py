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

from absl import flags

from dp_ftrl_tff.mechanisms import banded_optimizer, blt, tree
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_SKIP_BANDED = flags.DEFINE_bool('skip_banded', False, 'Skip the (longest) BandMF case.', flag_values=FLAGS)


def main(argv):
  del argv
  table3 = ParticipationSchema.b_min_sep(342, 6)
  rows = []  # (case, timing, target seconds, our result, anchor)

  timing = harness.timed(lambda: blt.optimize_blt(2052, table3, num_buffers=4, error='max'))
  losses = timing.value.losses
  rows.append(('BLT optimize, n=2052, b=342, k=6, 4 buffers', timing, 10.0,
               f'MaxLoss {losses.max_loss:.4f}, RmsLoss {losses.rms_loss:.4f}', 'paper 10.79'))

  timing = harness.timed(
      lambda: blt.optimize_blt(2000, ParticipationSchema.b_min_sep(400), error='max'))
  rows.append(('BLT optimize, n=2000, b=400, k=ceil(n/b), buffers 1..8', timing, 10.0,
               f'picks d={timing.value.strategy.num_buffers}, MaxLoss '
               f'{timing.value.losses.max_loss:.4f}', 'jax_privacy 112 s'))

  if not _SKIP_BANDED.value:
    timing = harness.timed(lambda: banded_optimizer.optimize_banded(2052, 342, table3, error='rms'))
    losses = timing.value.losses
    rows.append(('BandMF optimize, n=2052, 342 bands, k=6', timing, 120.0,
                 f'MaxLoss {losses.max_loss:.4f} / RmsLoss {losses.rms_loss:.4f}',
                 'dense optimizer 41 min; paper 10.21 / 8.60'))

  timing = harness.timed(lambda: tree.tree_sensitivity_squared(
      2000, ParticipationSchema.b_min_sep(314, 6)))
  rows.append(('exact tree sensitivity, n=2000, k=6, b=314', timing, 1.0,
               f'sens^2 {timing.value}', 'TF-Privacy 250 s (79)'))

  print(f'{harness.conditions()}; the docs/BENCHMARKS.md rows:')
  for case, timing, target, ours, anchor in rows:
    verdict = f'target < {target:g} s: {"met" if timing.wall < target else "not met"}'
    print(harness.benchmarks_row(case, f'{timing.wall:.2f} s, {ours}', anchor, verdict,
                                 'mechanisms_bench'), flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
