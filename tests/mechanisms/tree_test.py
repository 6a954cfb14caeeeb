"""Tests for `dp_ftrl_tff.mechanisms.tree` against independent computations.

References: dense matrix math (B C = A, A C^+), brute force over participation patterns, the paper's
recursive tree matrix (BLT paper Sec. 2.3), values recomputed from the DP-FTRL paper
(docs/papers.md#dp-ftrl: Honaker variances of App. B.1, sensitivities of App. D.2, D.2.1 and D.3),
BLT Table 3 (TreeAgg-Full), the Gboard launch Tables 1-2 (docs/papers.md#gboard) and TF-Privacy's
tree accountant on small cases.
"""

import importlib.util
import itertools
import pathlib

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import scipy.linalg

from dp_ftrl_tff.mechanisms import base, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

P = participation_lib.ParticipationSchema


def _recursive_tree(levels):
  """BLT paper Sec. 2.3: C^1 = [1], C^l = [[C^{l-1}, 0], [0, C^{l-1}], [1, 1]]."""
  c = np.ones((1, 1))
  for _ in range(levels - 1):
    zeros = np.zeros_like(c)
    c = np.vstack([np.hstack([c, zeros]), np.hstack([zeros, c]), np.ones((1, 2 * c.shape[1]))])
  return c


def _row_set(matrix):
  return sorted(tuple(row) for row in matrix.astype(int))


def _recipe_tree(num_rounds, completion):
  """BLT paper Sec. 2.3 tree (docs/papers.md#blt): 2^ceil(log2 n) leaves, complete (or real) rows.

  Keeping the complete rows and B = A C^+ reproduces Table 3's TreeAgg-Full losses.
  """
  full = _recursive_tree((num_rounds - 1).bit_length() + 1)
  inside = full[:, :num_rounds].sum(axis=1)
  keep = inside > 0 if completion else inside == full.sum(axis=1)
  return full[keep][:, :num_rounds]


def _brute_force(matrix, patterns):
  best = 0.0
  for pattern in patterns:
    u = np.zeros(matrix.shape[1])
    u[list(pattern)] = 1.0
    best = max(best, float(np.sum((matrix @ u)**2)))
  return best


def _segments_matrix(lengths, completed):
  return scipy.linalg.block_diag(*[tree.tree_matrix(m, c)
                                   for m, c in zip(lengths, completed, strict=True)])


# ---------------------------------------------------------------- nodes, C, decoders


@pytest.mark.parametrize('num_rounds', [1, 2, 3, 5, 8, 13, 16, 25])
@pytest.mark.parametrize('completion', [False, True])
def test_tree_matrix_matches_paper_recipe(num_rounds, completion):
  assert _row_set(tree.tree_matrix(num_rounds, completion)) == _row_set(
      _recipe_tree(num_rounds, completion))


@pytest.mark.parametrize('num_rounds', range(1, 40))
def test_node_order_is_streaming_order(num_rounds):
  starts, heights = tree.tree_nodes(num_rounds)
  ends = starts + 2**heights - 1
  assert starts.size == 2 * num_rounds - bin(num_rounds).count('1')
  # Sorted by last leaf, then height; and the closed-form row index agrees.
  keys = list(zip(ends.tolist(), heights.tolist(), strict=True))
  assert keys == sorted(keys)
  np.testing.assert_array_equal(tree.node_row(ends, heights), np.arange(starts.size))
  # Completion appends nodes (ending at virtual rounds) after the same leading rows.
  c_starts, c_heights = tree.tree_nodes(num_rounds, completion=True)
  np.testing.assert_array_equal(c_starts[:starts.size], starts)
  np.testing.assert_array_equal(c_heights[:starts.size], heights)


@pytest.mark.parametrize('variant', tree.VARIANTS)
@pytest.mark.parametrize('num_rounds', [1, 2, 6, 7, 8, 11, 16])
@pytest.mark.parametrize('completion', [False, True])
def test_decoder_reproduces_prefix_sums(variant, num_rounds, completion):
  strategy = tree.TreeStrategy(variant, completion)
  decoder = strategy.decoder_matrix(num_rounds)
  np.testing.assert_allclose(decoder @ strategy.strategy_matrix(num_rounds),
                             base.prefix_sum_workload(num_rounds), atol=1e-12)
  np.testing.assert_allclose(np.cumsum(strategy.noise_matrix(num_rounds), axis=0), decoder,
                             atol=1e-12)


@pytest.mark.parametrize('num_rounds', [1, 3, 5, 8, 13])
@pytest.mark.parametrize('completion', [False, True])
def test_full_decoder_is_pseudo_inverse(num_rounds, completion):
  c = tree.tree_matrix(num_rounds, completion)
  expected = base.prefix_sum_workload(num_rounds) @ np.linalg.pinv(c)
  np.testing.assert_allclose(tree.TreeStrategy('full', completion).decoder_matrix(num_rounds),
                             expected, atol=1e-10)


def test_vanilla_decoder_uses_the_binary_decomposition():
  decoder = tree.TreeStrategy('vanilla').decoder_matrix(1024)
  np.testing.assert_array_equal(decoder.sum(axis=1),
                                [bin(t).count('1') for t in range(1, 1025)])
  assert set(np.unique(decoder)) == {0.0, 1.0}


# Prefix-sum noise variances (DP-FTRL paper App. B.1: vanilla popcount(t), Honaker efficient
# sum over set bits k of 1 / (2 - 2^-k); it quotes 2.05 and 0.51 for t = 25, 32 in App. D.3.1;
# docs/papers.md#dp-ftrl): t (1-based prefix length) -> (vanilla, efficient).
_VARIANCE_TABLE = {
    1: (1, 1.0), 2: (1, 0.6667), 3: (2, 1.6667), 4: (1, 0.5714), 5: (2, 1.5714), 6: (2, 1.2381),
    7: (3, 2.2381), 8: (1, 0.5333), 15: (4, 2.7714), 16: (1, 0.5161), 25: (3, 2.0495),
    31: (5, 3.2876), 32: (1, 0.5079), 100: (3, 1.5833), 240: (4, 2.0300), 1395: (7, 4.1959),
    1600: (3, 1.5047),
}


@pytest.fixture(scope='module')
def decoders_1600():
  return {v: tree.TreeStrategy(v).decoder_matrix(1600) for v in ('vanilla', 'efficient')}


@pytest.mark.parametrize('t', sorted(_VARIANCE_TABLE))
def test_decoder_variances_match_honaker_table(decoders_1600, t):
  vanilla, efficient = _VARIANCE_TABLE[t]
  assert np.sum(decoders_1600['vanilla'][t - 1]**2) == pytest.approx(vanilla)
  assert np.sum(decoders_1600['efficient'][t - 1]**2) == pytest.approx(efficient, abs=5e-5)


@pytest.mark.parametrize('variant', tree.VARIANTS)
@pytest.mark.parametrize('num_rounds', [1, 2, 5, 8, 21, 64, 100])
def test_closed_form_errors_match_dense_decoder(variant, num_rounds):
  strategy = tree.TreeStrategy(variant)
  np.testing.assert_allclose(strategy.errors(num_rounds),
                             base.errors_from_decoder(strategy.decoder_matrix(num_rounds)),
                             rtol=1e-10)


def test_blt_table3_tree_agg_full():
  # BLT paper Table 3 (headers swapped, docs/papers.md#misprints): MaxLoss 14.98, RmsLoss 12.47
  # with the Remark 3.2 bound at n=2052, b=342, k=6 (sens 10.8628).
  participation = P.b_min_sep(342, 6)
  strategy = tree.TreeStrategy('full')
  lower = tree.earliest_pattern_sensitivity_squared(2052, participation)
  assert np.sqrt(lower) == pytest.approx(10.8628, abs=1e-4)
  max_error, rms_error = strategy.errors(2052)
  assert max_error * np.sqrt(lower) == pytest.approx(14.98, rel=5e-3)
  assert rms_error * np.sqrt(lower) == pytest.approx(12.47, rel=5e-3)
  # The exact sensitivity equals the bound here (the BLT paper conjectures it is tight for trees).
  assert strategy.sensitivity_squared(2052, participation) == lower


# ---------------------------------------------------------------- sensitivity


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(num_rounds=st.integers(1, 14), min_sep=st.integers(1, 15),
                  max_participations=st.integers(1, 5), completion=st.booleans())
def test_tree_sensitivity_matches_brute_force(num_rounds, min_sep, max_participations, completion):
  participation = P.b_min_sep(min_sep, max_participations)
  expected = _brute_force(tree.tree_matrix(num_rounds, completion),
                          patterns_lib.patterns(participation, num_rounds))
  assert tree.tree_sensitivity_squared(num_rounds, participation, completion) == expected
  assert tree.earliest_pattern_sensitivity_squared(num_rounds, participation,
                                                   completion) <= expected


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
                  min_sep=st.integers(1, 8), max_participations=st.integers(1, 4),
                  data=st.data())
def test_segments_sensitivity_matches_brute_force(lengths, min_sep, max_participations, data):
  completed = data.draw(st.lists(st.booleans(), min_size=len(lengths), max_size=len(lengths)))
  participation = P.b_min_sep(min_sep, max_participations)
  expected = _brute_force(_segments_matrix(lengths, completed),
                          patterns_lib.patterns(participation, sum(lengths)))
  assert tree.segments_sensitivity_squared(lengths, participation, completed) == expected


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
                  epochs=st.integers(1, 4), rounds_per_epoch=st.integers(1, 6),
                  completion=st.booleans())
def test_fixed_epoch_sensitivity_matches_brute_force(lengths, epochs, rounds_per_epoch,
                                                     completion):
  participation = P.fixed_epoch_order(epochs, rounds_per_epoch)
  expected = _brute_force(_segments_matrix(lengths, [completion] * len(lengths)),
                          patterns_lib.all_patterns(participation, sum(lengths)))
  assert tree.segments_sensitivity_squared(lengths, participation, completion) == expected


@pytest.mark.parametrize('num_rounds', [1, 2, 3, 7, 8, 9, 1000, 1024, 1600, 2052])
def test_single_participation_is_depth(num_rounds):
  single = P.single()
  assert tree.tree_sensitivity_squared(num_rounds, single) == num_rounds.bit_length()
  assert tree.tree_sensitivity_squared(num_rounds, single, completion=True) == (
      (num_rounds - 1).bit_length() + 1)


# DP-FTRL paper App. D.2, Thm. D.3 dynamic program (docs/papers.md#dp-ftrl), values recomputed:
# (T, E, xi) -> sens^2; xi = TF-Privacy min_separation = b - 1.
@pytest.mark.parametrize('total, epochs, xi, expected', [
    (1, 1, 0, 1), (8, 1, 0, 4), (1024, 1, 0, 11), (1600, 1, 0, 11), (8, 2, 3, 10), (16, 2, 7, 12),
    (16, 4, 3, 36), (64, 8, 7, 144), (100, 5, 19, 50), (500, 5, 99, 50), (2000, 20, 99, 425)])
def test_dp_ftrl_app_d_table(total, epochs, xi, expected):
  assert tree.tree_sensitivity_squared(total, P.b_min_sep(xi + 1, epochs)) == expected


# Gboard Tables 1-2 (docs/papers.md#gboard; S recomputed, rho = S / 98 rounds to the printed value):
# (rounds, MinS, MaxP) -> S; b = MinS + 1. The last rows use the worst-case MaxP; (2000, 313, 6) is
# the TF-Privacy anchor (rho 0.80612 at sigma 7).
@pytest.mark.parametrize('rounds, min_s, max_p, expected', [
    (930, 212, 4, 47), (1280, 180, 5, 87), (530, 54, 8, 182), (1900, 526, 3, 34),
    (3600, 909, 3, 44), (870, 327, 3, 31), (1300, 290, 4, 60), (430, 54, 7, 97),
    (930, 212, 5, 55), (530, 54, 10, 250), (2000, 313, 6, 79), (2000, 313, 7, 87)])
def test_gboard_tables(rounds, min_s, max_p, expected):
  assert tree.tree_sensitivity_squared(rounds, P.b_min_sep(min_s + 1, max_p)) == expected


@pytest.mark.parametrize('total, max_p, xi', [(13, 3, 2), (20, 4, 3), (32, 3, 5), (45, 5, 4)])
def test_matches_tf_privacy_on_small_cases(total, max_p, xi):
  # Load TF-Privacy's accountant module by path: the package __init__ would import TensorFlow.
  package = importlib.util.find_spec('tensorflow_privacy')
  if package is None:
    pytest.skip('tensorflow_privacy is not installed')
  path = (pathlib.Path(package.origin).parent / 'privacy' / 'analysis' /
          'tree_aggregation_accountant.py')
  spec = importlib.util.spec_from_file_location('tfp_tree_accountant', path)
  accountant = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(accountant)
  rho = accountant.compute_zcdp_single_tree(noise_multiplier=1.0, total_steps=total,
                                            max_participation=max_p, min_separation=xi)
  assert tree.tree_sensitivity_squared(total, P.b_min_sep(xi + 1, max_p)) == 2 * rho


def test_pattern_sensitivity_algorithm4_example():
  # DP-FTRL paper App. D.2.1, Alg. 4 example (docs/papers.md#dp-ftrl): order [1, 2, 3, 1, 4]
  # gives S = 8 (client 1), 3, 3, 1; with 3 virtual steps (completion) 12, 4, 4, 4.
  ids, values = tree.clients_sensitivity_squared([1, 2, 3, 1, 4], [0, 1, 2, 3, 4], [5])
  np.testing.assert_array_equal(ids, [1, 2, 3, 4])
  np.testing.assert_array_equal(values, [8, 3, 3, 1])
  _, values = tree.clients_sensitivity_squared([1, 2, 3, 1, 4], [0, 1, 2, 3, 4], [5], True)
  np.testing.assert_array_equal(values, [12, 4, 4, 4])
  assert tree.pattern_sensitivity_squared(5, [0, 3]) == 8


# DP-FTRL paper App. D.3 / D.3.1 schedules (CIFAR-10 and MNIST settings of Sec. 7 and App. F.2;
# S recomputed with Alg. 4; docs/papers.md#dp-ftrl): (steps/epoch, epochs, epochs per tree) -> S
# without / with completion (completion on every tree but the last).
@pytest.mark.parametrize('steps, epochs, every, plain, completed', [
    (100, 100, 1, 700, 799), (100, 100, 5, 1000, 1570), (100, 100, 20, 2125, 4129),
    (100, 100, 100, 14349, 14349), (25, 20, 1, 100, 119), (240, 5, 1, 40, 44)])
def test_same_order_schedules(steps, epochs, every, plain, completed):
  ids = np.tile(np.arange(steps), epochs)
  rounds = np.arange(steps * epochs)
  segments = [steps * every] * (epochs // every)
  completion = [True] * (len(segments) - 1) + [False]
  assert tree.clients_sensitivity_squared(ids, rounds, segments)[1].max() == plain
  assert tree.clients_sensitivity_squared(ids, rounds, segments, completion)[1].max() == completed


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=3), data=st.data())
def test_clients_sensitivity_matches_dense(lengths, data):
  total = sum(lengths)
  completed = data.draw(st.lists(st.booleans(), min_size=len(lengths), max_size=len(lengths)))
  rounds = data.draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=8))
  clients = data.draw(st.lists(st.integers(0, 2), min_size=len(rounds), max_size=len(rounds)))
  c = _segments_matrix(lengths, completed)
  ids, values = tree.clients_sensitivity_squared(clients, rounds, lengths, completed)
  for client, value in zip(ids, values, strict=True):
    u = np.bincount([r for r, i in zip(rounds, clients, strict=True) if i == client],
                    minlength=total)
    assert value == np.sum((c @ u)**2)


# ---------------------------------------------------------------- strategy plumbing


@pytest.mark.parametrize('variant, completion', itertools.product(tree.VARIANTS, [False, True]))
def test_config_round_trip(variant, completion):
  strategy = tree.TreeStrategy(variant, completion)
  assert strategy.name == {'vanilla': 'tree', 'efficient': 'tree_efficient',
                           'full': 'tree_full'}[variant]
  assert tree.TreeStrategy.from_config(strategy.to_config()) == strategy


def test_losses_use_exact_sensitivity():
  losses = tree.TreeStrategy('vanilla').losses(8, P.b_min_sep(4, 2))
  assert losses.sensitivity_squared == 10.0
  assert losses.max_loss == pytest.approx(np.sqrt(10.0 * 3))  # max popcount(t + 1), t < 8, is 3


@pytest.mark.parametrize('call, name', [
    (lambda: tree.TreeStrategy('nope'), 'variant'),
    (lambda: tree.TreeStrategy('vanilla', completion=1), 'completion'),
    (lambda: tree.tree_nodes(0), 'num_rounds'),
    (lambda: tree.tree_sensitivity_squared(5, 'single'), 'participation'),
    (lambda: tree.tree_sensitivity_squared(0, P.single()), 'num_rounds'),
    (lambda: tree.pattern_sensitivity_squared(4, [0.5]), 'rounds'),
    (lambda: tree.earliest_pattern_sensitivity_squared(4, None), 'participation'),
    (lambda: tree.segments_sensitivity_squared([], P.single()), 'segment_lengths'),
    (lambda: tree.segments_sensitivity_squared([3, 0], P.single()), 'segment_lengths'),
    (lambda: tree.segments_sensitivity_squared([3, 4], P.single(), [True]), 'completion'),
    (lambda: tree.clients_sensitivity_squared([0], [5], [5]), 'rounds'),
    (lambda: tree.node_row(2, 1), 'end'),
    (lambda: tree.TreeStrategy.from_config({'mechanism': 'blt'}), 'mechanism'),
    (lambda: tree.TreeStrategy.from_config({'mechanism': 'tree', 'extra': 1}), 'Unknown keys'),
])
def test_invalid_arguments_raise(call, name):
  with pytest.raises(ValueError, match=name):
    call()


def test_a_tree_too_large_for_the_exact_tables_names_every_setting_behind_k():
  with pytest.raises(ValueError, match=r'the exact tree sensitivity of k=100000000 participations '
                     r'over `num_rounds`=100000000 \(k = min\(`max_participations`, ceil\('
                     r'`num_rounds` / `min_sep`\)\)\) .* use fewer `num_rounds` or restarts, a '
                     r'larger `min_sep`, or a smaller `max_participations`'):
    tree.tree_sensitivity_squared(10**8, participation_lib.ParticipationSchema(1))
