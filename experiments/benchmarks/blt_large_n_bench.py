"""Times the BLT optimizer at large n and compares its loss with the n-independent limit.

Setting: b-min-sep participation with every admissible participation (k = ceil(n / b)), b = 400 (the
BLT paper's App. A setting), MaxLoss, `--num_buffers` buffers. Both loss factors grow with n: the
normalized loss MaxLoss / sqrt(n k) of a fixed BLT converges (`blt.limit_normalized_loss`), and no
BLT's limit is below 1 / sqrt(b) (Cauchy-Schwarz; the App. A BLTs attain it). Per n the benchmark
prints the optimizer's time, MaxLoss, the normalized loss over 1 / sqrt(b) (1 = the limit; it tends to
1 as n grows), and the optimized BLT's own limit over 1 / sqrt(b). The time anchor is the first n of
`--num_rounds`, measured in the same run (ratio = time / anchor time, against the ratio of n).

  .venv/bin/python -m experiments.benchmarks.blt_large_n_bench [--num_rounds=2000,100000,1000000]
"""

import numpy as np
from absl import flags

from dp_ftrl_tff.mechanisms import blt
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments.benchmarks import harness
from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_NUM_ROUNDS = flags.DEFINE_list('num_rounds', ['2000', '100000', '1000000'],
                                'Values of n; the first is the time anchor.', flag_values=FLAGS)
_MIN_SEP = flags.DEFINE_integer('min_sep', 400, 'b (rounds between participations + 1).', flag_values=FLAGS)
_NUM_BUFFERS = flags.DEFINE_integer('num_buffers', 4, 'BLT buffers d.', flag_values=FLAGS)


def main(argv):
  del argv
  try:
    sizes = [int(value) for value in _NUM_ROUNDS.value]
    if not sizes or min(sizes) < 1:
      raise ValueError
  except ValueError:
    flag_parsing.exit_with_error(
        ValueError(f'--num_rounds must be positive integers, got {_NUM_ROUNDS.value}'), FLAGS)
  if _MIN_SEP.value < 1 or _NUM_BUFFERS.value < 1:
    flag_parsing.exit_with_error(ValueError('--min_sep and --num_buffers must be positive'), FLAGS)
  if max(sizes) > 10**7:
    flag_parsing.exit_with_error(ValueError(f'--num_rounds above 10^7 ({max(sizes)}) would need '
                                            'several GB per objective evaluation'), FLAGS)
  b = _MIN_SEP.value
  floor = 1.0 / np.sqrt(b)
  participation = ParticipationSchema.b_min_sep(b)
  print(f'at start: {harness.conditions()}; limit 1/sqrt(b) = {floor:.6f}', flush=True)
  anchor = None
  for n in sizes:
    timing = harness.timed(
        lambda n=n: blt.optimize_blt(n, participation, num_buffers=_NUM_BUFFERS.value, error='max'))
    result, wall, cpu = timing.value, timing.wall, timing.cpu
    anchor = anchor or (n, wall)
    k = participation.effective_max_participations(n)
    normalized = result.losses.max_loss / np.sqrt(n * k)
    own_limit = blt.limit_normalized_loss(result.strategy, b)
    print(f'n={n} k={k} d={_NUM_BUFFERS.value}: {wall:.1f} s (cpu {cpu:.1f} s; {harness.ratio(wall, anchor[1]):.1f}x '
          f'the n={anchor[0]} time for {n / anchor[0]:.0f}x the rounds)  MaxLoss '
          f'{result.losses.max_loss:.4f}  MaxLoss/sqrt(nk) {normalized:.6f} = {normalized / floor:.4f} '
          f'x limit; own limit {own_limit / floor:.6f} x limit; 1 - theta_1 '
          f'{1 - max(result.strategy.theta):.3g}', flush=True)
  print(f'at end: {harness.conditions()}', flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
