"""Closed-form banded square roots (BSR, BISR) against optimized BandMF and BLT.

Prints, for one setting (default: the StackOverflow setting of BLT paper Table 3 and BandMF Table 2,
n = 2052, min_sep b = 342, k = 6), each mechanism's MaxLoss and RmsLoss (clip norm 1, noise
multiplier 1), whether its sensitivity is exact, its wall time (build or optimize plus losses), and
the ratio of its losses to the anchor measured in the same run: optimized BandMF (342 bands,
RmsLoss), or optimized BLT with --skip_banded.

  .venv/bin/python -m experiments.benchmarks.square_root_bench [--num_bands=H ...] [--skip_banded]
"""

from absl import flags

from dp_ftrl_tff.mechanisms import banded_optimizer, blt, square_root
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_ROUNDS = flags.DEFINE_integer('num_rounds', 2052, 'Rounds n.', lower_bound=1, flag_values=FLAGS)
_MIN_SEP = flags.DEFINE_integer('min_sep', 342, 'Min-sep b.', lower_bound=1, flag_values=FLAGS)
_K = flags.DEFINE_integer('max_participations', 6, 'Participations k.', lower_bound=1,
                          flag_values=FLAGS)
_BANDS = flags.DEFINE_multi_integer('num_bands', None, 'Bands b-hat of BSR and BISR, repeatable '
                                    '(default: min(min_sep, num_rounds)); BandMF uses the first.',
                                    lower_bound=1, flag_values=FLAGS)
_BUFFERS = flags.DEFINE_integer('num_buffers', 4, 'BLT buffers d.', lower_bound=1,
                                flag_values=FLAGS)
_SKIP_BANDED = flags.DEFINE_bool('skip_banded', False, 'Skip BandMF (about a minute at n=2052).',
                                 flag_values=FLAGS)


def main(argv):
  del argv
  n = _ROUNDS.value
  schema = ParticipationSchema.b_min_sep(_MIN_SEP.value, _K.value)
  bands = _BANDS.value or [min(_MIN_SEP.value, n)]
  rows = []  # (name, seconds, losses, exact)
  for num_bands in bands:
    for cls in (square_root.BandedSquareRootStrategy,
                square_root.BandedInverseSquareRootStrategy):
      strategy = cls(num_bands)
      timing = harness.timed(lambda s=strategy: s.losses(n, schema))
      rows.append((f'{strategy.name} bands={num_bands}', timing.wall, timing.value,
                   strategy.sensitivity_is_exact(n, schema)))
  timing = harness.timed(lambda: blt.optimize_blt(n, schema, num_buffers=_BUFFERS.value,
                                                  error='max'))
  result = timing.value
  rows.append((f'BLT optimized d={_BUFFERS.value} (max)', timing.wall, result.losses,
               result.strategy.sensitivity_is_exact(n, schema)))
  anchor = rows[-1]
  if not _SKIP_BANDED.value:
    num_bands = min(bands[0], n)
    timing = harness.timed(
        lambda: banded_optimizer.optimize_banded(n, num_bands, schema, error='rms'))
    result = timing.value
    rows.append((f'BandMF optimized bands={num_bands} (rms)', timing.wall, result.losses,
                 result.strategy.sensitivity_is_exact(n, schema)))
    anchor = rows[-1]

  print(f'n={n} min_sep={schema.min_sep} k={schema.effective_max_participations(n)}; '
        f'anchor: {anchor[0]}')
  print(f"{'mechanism':36s} {'seconds':>8s} {'MaxLoss':>9s} {'RmsLoss':>9s} {'max/anchor':>10s} "
        f"{'rms/anchor':>10s}  sensitivity")
  for name, seconds, losses, exact in rows:
    print(f'{name:36s} {seconds:8.3f} {losses.max_loss:9.4f} {losses.rms_loss:9.4f} '
          f'{harness.ratio(losses.max_loss, anchor[2].max_loss):10.4f} '
          f'{harness.ratio(losses.rms_loss, anchor[2].rms_loss):10.4f}  '
          f'{"exact" if exact else "upper bound"}',
          flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
