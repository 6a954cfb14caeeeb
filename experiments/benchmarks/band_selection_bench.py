r"""Amplified BandMF band selection at the BandMF paper's StackOverflow setting (Table 5).

  python -m experiments.benchmarks.band_selection_bench [--epsilons=1,2,4,8,16 \
      --selection_rtol=0.005]

Setting: n = 2052 rounds, m = 342477 clients, B = 1000 per round, delta = 1e-6, cyclic Poisson
sampling (`dp_ftrl_tff.accounting.amplification`). For each epsilon it prints
  * the paper's b-hat and noise multiplier z (Table 5 lists z for C normalized to sensitivity 1
    under (k=6, b=342), i.e. column norm 1/sqrt(6): z = sigma / sqrt(6));
  * our sigma at the paper's b-hat (PLD, discretization 1e-4), as z, and its ratio to the paper's;
  * DP-SGD with amplification (b-hat = 1) the same way;
  * the selected b-hat (`band_selection.BandSelector.select`), its z and prefix-sum RMSE
    sigma * RmsLoss, and the RMSE ratio at the paper's b-hat / ours (anchor: the paper's choice,
    optimized here with the same optimizer in the same run);
  * how many b-hat were optimized and the wall time (losses are cached across epsilons).
Results go to docs/amplification.md by hand (timings depend on machine load).
"""

import math
import time

from absl import app, flags

from dp_ftrl_tff.accounting import amplification, band_selection
from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_EPSILONS = flags.DEFINE_list('epsilons', ['1', '2', '4', '8', '16'], 'Target epsilons.',
                              flag_values=FLAGS)
_SELECTION_RTOL = flags.DEFINE_float('selection_rtol', 0.005,
                                     'Accept a b-hat within this relative RMSE of the optimum.',
                                     flag_values=FLAGS)
_MAX_ITERATIONS = flags.DEFINE_integer('max_iterations', 100, 'BandMF optimizer iterations.',
                                       flag_values=FLAGS)

ROUNDS, DATASET_SIZE, BATCH_SIZE, DELTA, EPOCHS = 2052, 342477, 1000, 1e-6, 6
#: Table 5 of the BandMF paper: epsilon -> (b-hat, BandMF z, DP-SGD z); at epsilon 16 the paper
#: reports the unamplified multi-epoch MF (z = 0.36861), so no b-hat.
PAPER = {1.0: (9, 0.79118, 0.37313), 2.0: (18, 0.64708, 0.30481), 4.0: (32, 0.52224, 0.25136),
         8.0: (64, 0.43490, 0.20567), 16.0: (None, 0.36861, 0.16876)}


def _z(epsilon: float, bands: int) -> float:
  q = amplification.group_sampling_prob(DATASET_SIZE, BATCH_SIZE, bands)
  return amplification.amplified_noise_multiplier(epsilon, ROUNDS, bands, q, DELTA) / math.sqrt(
      EPOCHS)


def main(argv):
  del argv
  epsilons = [float(e) for e in _EPSILONS.value]
  selector = band_selection.BandSelector(ROUNDS, DATASET_SIZE, BATCH_SIZE,
                                         max_iterations=_MAX_ITERATIONS.value)
  start = time.monotonic()
  print('eps | paper b | paper z | our z at paper b (ratio) | DP-SGD paper z | our DP-SGD z (ratio)'
        ' | our b | our z | our RMSE | RMSE at paper b / ours | b optimized | s')
  for epsilon in epsilons:
    t0 = time.monotonic()
    paper_bands, paper_z, paper_sgd = PAPER.get(epsilon, (None, math.nan, math.nan))
    selection = selector.select(epsilon, DELTA, _SELECTION_RTOL.value)
    best = selection.best
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
          f'{ratio} | {len(selection.candidates)} | {time.monotonic() - t0:.0f}', flush=True)
    print('   candidates (b, z, RmsLoss, RMSE): ' + ', '.join(
        f'({c.num_bands}, {c.noise_multiplier / math.sqrt(EPOCHS):.4f}, {c.loss:.3f}, '
        f'{c.rmse:.3f})' for c in selection.candidates), flush=True)
  print(f'total {time.monotonic() - start:.0f} s')


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
