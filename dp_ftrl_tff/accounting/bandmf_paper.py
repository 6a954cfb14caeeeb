"""The BandMF paper's published band selections and their settings (Choquette-Choo et al. 2023,
"Amplified banded matrix factorization", Table 5 and App. G.1; docs/amplification.md).

The reference that the paper-tier tests check `band_selection` against and that
`experiments.benchmarks.band_selection_bench` prints beside its own selections. Conventions: delta
1e-6; a noise multiplier z is the paper's, for C normalized to sensitivity 1 under (k = EPOCHS,
b = ROUNDS / EPOCHS), i.e. z = sigma / sqrt(EPOCHS) for sigma relative to a column norm of 1.
"""

from typing import Dict, Optional, Tuple

from dp_ftrl_tff.accounting import band_selection

DELTA = 1e-6
#: Table 5's setting: n rounds, m clients, B clients per round, epochs (k).
ROUNDS, DATASET_SIZE, BATCH_SIZE, EPOCHS = 2052, 342477, 1000, 6
#: Table 5: epsilon -> (b-hat, BandMF z, DP-SGD z); at epsilon 16 the paper reports the unamplified
#: multi-epoch MF (z = 0.36861), so no b-hat.
TABLE5: Dict[float, Tuple[Optional[int], float, float]] = {
    1.0: (9, 0.79118, 0.37313), 2.0: (18, 0.64708, 0.30481), 4.0: (32, 0.52224, 0.25136),
    8.0: (64, 0.43490, 0.20567), 16.0: (None, 0.36861, 0.16876)}

#: App. G.1's setting: n = 1024 rounds, m / B = n / epochs with B = 1.
G1_ROUNDS = 1024
G1_EPOCHS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: App. G.1: epsilon -> the optimal b-hat for each entry of `G1_EPOCHS`.
G1: Dict[float, Tuple[int, ...]] = {
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
  """The App. G.1 setting for `epochs`: n = 1024, m = n / epochs, B = 1 (q = b-hat / m).

  Raises:
    ValueError: `epochs` is not one of `G1_EPOCHS`.
  """
  if epochs not in G1_EPOCHS:
    raise ValueError(f'`epochs` must be one of {G1_EPOCHS}, got {epochs!r}.')
  return band_selection.BandSelector(G1_ROUNDS, G1_ROUNDS // epochs, 1,
                                     max_iterations=max_iterations)
