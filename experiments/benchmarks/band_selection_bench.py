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
paper's table (`PAPER_G1`), with the paper's value where ours differs and the RMSE ratio of the
paper's b-hat to ours there.
Results go to docs/amplification.md by hand (timings depend on machine load).
"""

import math
import time

from absl import app, flags

from dp_ftrl_tff.accounting import amplification, band_selection
from experiments.cli import flag_parsing

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

ROUNDS, DATASET_SIZE, BATCH_SIZE, DELTA, EPOCHS = 2052, 342477, 1000, 1e-6, 6
#: Table 5 of the BandMF paper: epsilon -> (b-hat, BandMF z, DP-SGD z); at epsilon 16 the paper
#: reports the unamplified multi-epoch MF (z = 0.36861), so no b-hat.
PAPER = {1.0: (9, 0.79118, 0.37313), 2.0: (18, 0.64708, 0.30481), 4.0: (32, 0.52224, 0.25136),
         8.0: (64, 0.43490, 0.20567), 16.0: (None, 0.36861, 0.16876)}

G1_ROUNDS = 1024
G1_EPOCHS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: BandMF paper App. G.1: epsilon -> the optimal b-hat for each entry of `G1_EPOCHS` (n = 1024).
PAPER_G1 = {
    0.03125: (2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1),
    0.0625: (4, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1),
    0.125: (8, 4, 2, 1, 1, 1, 1, 1, 1, 1, 1),
    0.25: (8, 4, 4, 2, 1, 1, 1, 1, 1, 1, 1),
    0.5: (16, 8, 4, 4, 2, 1, 1, 1, 1, 1, 1),
    1.0: (32, 16, 8, 4, 2, 2, 1, 1, 1, 1, 1),
    2.0: (64, 32, 16, 8, 4, 2, 2, 1, 1, 1, 1),
    4.0: (128, 64, 32, 16, 8, 4, 2, 2, 1, 1, 1),
    8.0: (1024, 512, 256, 32, 16, 8, 4, 2, 2, 1, 1),
    16.0: (1024, 512, 256, 128, 64, 32, 8, 4, 4, 2, 1),
}


def g1_selector(epochs: int, max_iterations: int = 100) -> band_selection.BandSelector:
  """The App. G.1 setting for `epochs`: n = 1024, m = n / epochs, B = 1 (q = b-hat / m)."""
  return band_selection.BandSelector(G1_ROUNDS, G1_ROUNDS // epochs, 1,
                                     max_iterations=max_iterations)


def _z(epsilon: float, bands: int) -> float:
  q = amplification.group_sampling_prob(DATASET_SIZE, BATCH_SIZE, bands)
  return amplification.amplified_noise_multiplier(epsilon, ROUNDS, bands, q, DELTA) / math.sqrt(
      EPOCHS)


def _table5(epsilons) -> None:
  selector = band_selection.BandSelector(ROUNDS, DATASET_SIZE, BATCH_SIZE,
                                         max_iterations=_MAX_ITERATIONS.value)
  start = time.monotonic()
  print('eps | paper b | paper z | our z at paper b (ratio) | DP-SGD paper z | our DP-SGD z (ratio)'
        ' | full: b | z | RMSE | RMSE at paper b / full | b optimized | s'
        ' | pow2: b | z | RMSE | RMSE / full | s')
  for epsilon in epsilons:
    t0 = time.monotonic()
    paper_bands, paper_z, paper_sgd = PAPER.get(epsilon, (None, math.nan, math.nan))
    full = selector.select(epsilon, DELTA, _SELECTION_RTOL.value)
    full_seconds = time.monotonic() - t0
    t1 = time.monotonic()
    pow2 = selector.select(epsilon, DELTA, candidates='pow2')
    pow2_seconds = time.monotonic() - t1
    best = full.best
    if paper_bands is not None:
      z_paper_b = _z(epsilon, paper_bands)
      rmse_paper_b = selector.candidate(paper_bands, epsilon, DELTA).rmse
      paper_cells = (f'{paper_bands} | {paper_z:.5f} | {z_paper_b:.5f} ({z_paper_b / paper_z:.4f}) '
                     f'| {paper_sgd:.5f}')
      ratio = f'{rmse_paper_b / best.rmse:.4f}'
    else:
      paper_cells, ratio = f'- | {paper_z:.5f} (unamplified MF) | - | {paper_sgd:.5f}', '-'
    z_sgd = _z(epsilon, 1)
    print(f'{epsilon:g} | {paper_cells} | {z_sgd:.5f} ({z_sgd / paper_sgd:.4f}) | '
          f'{best.num_bands} | {best.noise_multiplier / math.sqrt(EPOCHS):.5f} | {best.rmse:.4f} | '
          f'{ratio} | {len(full.candidates)} | {full_seconds:.0f} | {pow2.best.num_bands} | '
          f'{pow2.best.noise_multiplier / math.sqrt(EPOCHS):.5f} | {pow2.best.rmse:.4f} | '
          f'{pow2.best.rmse / best.rmse:.4f} | {pow2_seconds:.0f}', flush=True)
    for selection in (full, pow2):
      print(f'   {selection.candidate_set}: (b, z, RmsLoss, RMSE) ' + ', '.join(
          f'({c.num_bands}, {c.noise_multiplier / math.sqrt(EPOCHS):.4f}, {c.loss:.3f}, '
          f'{c.rmse:.3f})' for c in selection.candidates), flush=True)
  print(f'total {time.monotonic() - start:.0f} s')


def _g1() -> None:
  start = time.monotonic()
  ours = {epsilon: [] for epsilon in PAPER_G1}
  ratios = {}
  for column, epochs in enumerate(G1_EPOCHS):
    selector = g1_selector(epochs, _MAX_ITERATIONS.value)
    for epsilon, paper_row in PAPER_G1.items():
      selection = selector.select(epsilon, DELTA, candidates='pow2')
      ours[epsilon].append(selection.best.num_bands)
      if selection.best.num_bands != paper_row[column]:
        ratios[epsilon, epochs] = (selector.candidate(paper_row[column], epsilon, DELTA).rmse
                                   / selection.best.rmse)
    print(f'epochs {epochs} done, {time.monotonic() - start:.0f} s', flush=True)
  print('eps \\ epochs | ' + ' | '.join(str(e) for e in G1_EPOCHS))
  matches = 0
  for epsilon, paper_row in PAPER_G1.items():
    cells = []
    for ours_b, paper_b in zip(ours[epsilon], paper_row, strict=True):
      matches += ours_b == paper_b
      cells.append(str(ours_b) if ours_b == paper_b else f'{ours_b} (paper {paper_b})')
    print(f'{epsilon:g} | ' + ' | '.join(cells))
  print(f'{matches} of {len(PAPER_G1) * len(G1_EPOCHS)} cells match')
  for (epsilon, epochs), ratio in sorted(ratios.items()):
    print(f'  epsilon {epsilon:g}, {epochs} epochs: RMSE at the paper\'s b-hat / ours = {ratio:.4f}')
  print(f'total {time.monotonic() - start:.0f} s')


def main(argv):
  del argv
  if _TABLE.value == 'g1':
    _g1()
  else:
    _table5([float(e) for e in _EPSILONS.value])


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
