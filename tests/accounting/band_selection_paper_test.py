"""The BandMF paper's numbers of bands, reproduced on its grid, the powers of two (paper tier).

App. G.1 (n = 1024, m / B = n / epochs, delta 1e-6): the optimal b-hat of several (epsilon, epochs)
cells, including the jump to b-hat = n / epochs (no amplification) at epsilon >= 8 and a cell at 32
epochs or more; Table 5 (n = 2052, m = 342477, B = 1000, delta 1e-6): b-hat = 32 and 64 at epsilon 4
and 8. `experiments.benchmarks.band_selection_bench --table=g1` prints the whole G.1 table.
"""

import pytest

from dp_ftrl_tff.accounting import band_selection
from dp_ftrl_tff.accounting import bandmf_paper as paper

pytestmark = pytest.mark.paper

# (epochs, epsilons): the cells checked, grouped so that one selector's losses serve each column;
# epsilon 1/8 checks the search's PLD discretization at small epsilons (a fixed 1e-3 gave 4, not 2).
G1_CELLS = [(1, (1.0, 8.0)), (4, (0.125, 0.25, 4.0, 8.0)), (32, (2.0, 16.0))]


@pytest.mark.parametrize('epochs, epsilons', G1_CELLS)
def test_g1_cells_on_powers_of_two(epochs, epsilons):
  selector = paper.g1_selector(epochs)
  column = paper.G1_EPOCHS.index(epochs)
  for epsilon in epsilons:
    selection = selector.select(epsilon, paper.DELTA, candidates='pow2')
    assert selection.candidate_set.startswith('pow2 1, 2, 4')
    assert selection.best.num_bands == paper.G1[epsilon][column], (epsilon, epochs)


def test_table5_at_epsilon_4_and_8_on_powers_of_two():
  selector = band_selection.BandSelector(paper.ROUNDS, paper.DATASET_SIZE, paper.BATCH_SIZE)
  for epsilon in (4.0, 8.0):
    selection = selector.select(epsilon, paper.DELTA, candidates='pow2')
    assert selection.candidate_set == 'pow2 1, 2, 4, 8, 16, 32, 64, 128, 256'
    assert selection.best.num_bands == paper.TABLE5[epsilon][0], epsilon


def test_paper_g1_table_as_transcribed():
  # The paper's table: 10 epsilons x 11 epochs, b-hat a power of two <= n / epochs, non-decreasing
  # in epsilon and non-increasing in epochs (App. G.1); at epsilon >= 8 and <= 4 epochs it is
  # n / epochs (no amplification).
  rows = [paper.G1[epsilon] for epsilon in sorted(paper.G1)]
  assert len(rows) == 10 and all(len(row) == len(paper.G1_EPOCHS) == 11 for row in rows)
  for row in rows:
    assert all(b in band_selection.powers_of_two(paper.G1_ROUNDS // epochs)
               for b, epochs in zip(row, paper.G1_EPOCHS, strict=True))
    assert list(row) == sorted(row, reverse=True)
  for column in range(11):
    assert [row[column] for row in rows] == sorted(row[column] for row in rows)
  for epsilon in (8.0, 16.0):
    assert paper.G1[epsilon][:3] == (1024, 512, 256)
