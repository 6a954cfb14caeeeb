r"""Amplified BandMF band selection against the BandMF paper: Table 5 and the App. G.1 table.

  python -m experiments.benchmarks.band_selection_bench [--table=table5] [--epsilons=1,2,4,8,16 \
      --selection_rtol=0.005]
  python -m experiments.benchmarks.band_selection_bench --table=g1

Table 5 (`--table=table5`): n = 2052 rounds, m = 342477 clients, B = 1000 per round, delta = 1e-6,
cyclic Poisson sampling (`dp_ftrl_tff.accounting.amplification`). For each epsilon it prints
  * the paper's b-hat and noise multiplier z (Table 5 lists z for C normalized to sensitivity 1
    under (k=6, b=342), i.e. column norm 1/sqrt(6): z = sigma / sqrt(6));
  * our sigma at the paper's b-hat (PLD, discretization 1e-4), as z, and its ratio to the paper's;
  * DP-SGD with amplification (b-hat = 1) the same way;
  * the b-hat of the full search (`BandSelector.select`, `--selection_rtol`) and of the powers of
    two (`candidates='pow2'`, the paper's grid), each with its z and prefix-sum RMSE
    sigma * RmsLoss, and the RMSE at the paper's b-hat / the full search's (anchor: the paper's
    choice, optimized here with the same optimizer in the same run);
  * how many b-hat were optimized and the wall time (losses are cached across epsilons).

App. G.1 (`--table=g1`): n = 1024 rounds, m / B = n / epochs (B = 1, so q = b-hat epochs / n), delta
1e-6, the b-hat minimizing the RMSE over the powers of two, for every (epsilon, epochs) cell of the
paper's table (`dp_ftrl_tff.accounting.bandmf_paper.G1`), with the paper's value where ours differs
and the RMSE ratio of the paper's b-hat to ours there.
Results go to docs/amplification.md by hand (timings depend on machine load).
"""

import math

from absl import flags

from dp_ftrl_tff.accounting import amplification, band_selection
from dp_ftrl_tff.accounting import bandmf_paper as paper
from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_TABLE = flags.DEFINE_enum('table', 'table5', ['table5', 'g1'], 'The paper table to reproduce.',
                           flag_values=FLAGS)
_EPSILONS = flags.DEFINE_list('epsilons', ['1', '2', '4', '8', '16'],
                              'Target epsilons (table5; g1 runs the paper\'s rows).',
                              flag_values=FLAGS)
_SELECTION_RTOL = flags.DEFINE_float('selection_rtol', 0.005,
                                     'table5: the full search accepts a b-hat within this relative '
                                     'RMSE of the optimum.', flag_values=FLAGS)
_MAX_ITERATIONS = flags.DEFINE_integer('max_iterations', 100, 'BandMF optimizer iterations.',
                                       flag_values=FLAGS)

def _z(epsilon: float, bands: int) -> float:
  q = amplification.group_sampling_prob(paper.DATASET_SIZE, paper.BATCH_SIZE, bands)
  sigma = amplification.amplified_noise_multiplier(epsilon, paper.ROUNDS, bands, q, paper.DELTA)
  return sigma / math.sqrt(paper.EPOCHS)


def _table5(epsilons) -> None:
  selector = band_selection.BandSelector(paper.ROUNDS, paper.DATASET_SIZE, paper.BATCH_SIZE,
                                         max_iterations=_MAX_ITERATIONS.value)
  print('eps | paper b | paper z | our z at paper b (ratio) | DP-SGD paper z | our DP-SGD z (ratio)'
        ' | full: b | z | RMSE | RMSE at paper b / full | b optimized | s'
        ' | pow2: b | z | RMSE | RMSE / full | s')
  for epsilon in epsilons:
    paper_bands, paper_z, paper_sgd = paper.TABLE5.get(epsilon, (None, math.nan, math.nan))
    timing = harness.timed(lambda e=epsilon: selector.select(e, paper.DELTA, _SELECTION_RTOL.value))
    full, full_seconds = timing.value, timing.wall
    timing = harness.timed(lambda e=epsilon: selector.select(e, paper.DELTA, candidates='pow2'))
    pow2, pow2_seconds = timing.value, timing.wall
    best = full.best
    if paper_bands is not None:
      z_paper_b = _z(epsilon, paper_bands)
      rmse_paper_b = selector.candidate(paper_bands, epsilon, paper.DELTA).rmse
      paper_cells = (f'{paper_bands} | {paper_z:.5f} | {z_paper_b:.5f} ({z_paper_b / paper_z:.4f}) '
                     f'| {paper_sgd:.5f}')
      ratio = f'{rmse_paper_b / best.rmse:.4f}'
    else:
      paper_cells, ratio = f'- | {paper_z:.5f} (unamplified MF) | - | {paper_sgd:.5f}', '-'
    z_sgd = _z(epsilon, 1)
    print(f'{epsilon:g} | {paper_cells} | {z_sgd:.5f} ({z_sgd / paper_sgd:.4f}) | '
          f'{best.num_bands} | {best.noise_multiplier / math.sqrt(paper.EPOCHS):.5f} | '
          f'{best.rmse:.4f} | '
          f'{ratio} | {len(full.candidates)} | {full_seconds:.0f} | {pow2.best.num_bands} | '
          f'{pow2.best.noise_multiplier / math.sqrt(paper.EPOCHS):.5f} | {pow2.best.rmse:.4f} | '
          f'{pow2.best.rmse / best.rmse:.4f} | {pow2_seconds:.0f}', flush=True)
    for selection in (full, pow2):
      print(f'   {selection.candidate_set}: (b, z, RmsLoss, RMSE) ' + ', '.join(
          f'({c.num_bands}, {c.noise_multiplier / math.sqrt(paper.EPOCHS):.4f}, {c.loss:.3f}, '
          f'{c.rmse:.3f})' for c in selection.candidates), flush=True)


def _g1() -> None:
  ours = {epsilon: [] for epsilon in paper.G1}
  ratios = {}
  for column, epochs in enumerate(paper.G1_EPOCHS):
    timing = harness.timed(lambda e=epochs, c=column: _g1_column(e, c, ours, ratios))
    print(f'epochs {epochs} done, {timing.wall:.0f} s', flush=True)
  _print_g1(ours, ratios)


def _g1_column(epochs: int, column: int, ours: dict, ratios: dict) -> None:
  """Selects every epsilon's b-hat of one `epochs` column into `ours`; where it is not the paper's,
  the RMSE ratio of the paper's b-hat to ours into `ratios`."""
  selector = paper.g1_selector(epochs, _MAX_ITERATIONS.value)
  for epsilon, paper_row in paper.G1.items():
    selection = selector.select(epsilon, paper.DELTA, candidates='pow2')
    ours[epsilon].append(selection.best.num_bands)
    if selection.best.num_bands != paper_row[column]:
      at_paper_b = selector.candidate(paper_row[column], epsilon, paper.DELTA)
      ratios[epsilon, epochs] = harness.ratio(at_paper_b.rmse, selection.best.rmse)


def _print_g1(ours: dict, ratios: dict) -> None:
  print('eps \\ epochs | ' + ' | '.join(str(e) for e in paper.G1_EPOCHS))
  matches = 0
  for epsilon, paper_row in paper.G1.items():
    cells = []
    for ours_b, paper_b in zip(ours[epsilon], paper_row, strict=True):
      matches += ours_b == paper_b
      cells.append(str(ours_b) if ours_b == paper_b else f'{ours_b} (paper {paper_b})')
    print(f'{epsilon:g} | ' + ' | '.join(cells))
  print(f'{matches} of {len(paper.G1) * len(paper.G1_EPOCHS)} cells match')
  for (epsilon, epochs), ratio in sorted(ratios.items()):
    print(f'  epsilon {epsilon:g}, {epochs} epochs: RMSE at the paper\'s b-hat / ours = {ratio:.4f}')


def main(argv):
  del argv
  if _TABLE.value == 'g1':
    timing = harness.timed(_g1)
  else:
    timing = harness.timed(lambda: _table5([float(e) for e in _EPSILONS.value]))
  print(f'total {timing.wall:.0f} s')


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
