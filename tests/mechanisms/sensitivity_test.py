"""Tests for sensitivity: brute force over every participation pattern on small n.

For a pattern pi and Gram X = C^T C, the true squared sensitivity is sup tr(u^T X_pi u) over rows
||u_i|| <= 1. Brute-force references used here:
  * `_sign_value`: max over sign vectors s of s^T X_pi s, the exact sup for one-dimensional updates; it
    is ATTAINED, so every valid upper bound must be >= it, and it equals the truth when X_pi >= 0;
  * `_eq5_value`: sum |X_pi|, an upper bound on the truth (BandMF Eq. 5).
When the two coincide for the worst pattern, the truth is known exactly.
"""

import itertools

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import sensitivity, toeplitz
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

P = participation_lib.ParticipationSchema
SETTINGS = hypothesis.settings(deadline=None, max_examples=60)
THETA_400 = np.array([0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778])
OMEGA_400 = np.array([0.0070314825502323835, 0.10613806907600574, 0.1898159060327625,
                      0.1966594748073734])


def _sign_value(sub):
  m = sub.shape[0]
  signs = np.array(list(itertools.product([-1.0, 1.0], repeat=m)))
  return float(np.max(np.einsum('si,ij,sj->s', signs, sub, signs)))


def _eq5_value(sub):
  return float(np.sum(np.abs(sub)))


def brute_force(c, schema):
  """(attained lower bound, Eq. 5 upper bound) of the squared sensitivity, over all patterns."""
  gram = c.T @ c
  lower, upper = 0.0, 0.0
  for pattern in patterns_lib.all_patterns(schema, c.shape[1]):
    sub = gram[np.ix_(pattern, pattern)]
    lower = max(lower, _sign_value(sub))
    upper = max(upper, _eq5_value(sub))
  return lower, upper


def _schema(draw_b, draw_k, fixed):
  if fixed:
    return P.fixed_epoch_order(draw_k or 2, draw_b)
  if draw_k is None:  # unbounded k: keep the brute force small with a larger b
    return P.b_min_sep(draw_b + 2)
  return P.b_min_sep(draw_b, draw_k)


schemas = st.builds(_schema, st.integers(1, 4), st.one_of(st.none(), st.integers(1, 4)),
                    st.booleans())
min_sep_schemas = st.builds(P.b_min_sep, st.integers(1, 4),
                            st.one_of(st.none(), st.integers(1, 4)))


@SETTINGS
@hypothesis.given(n=st.integers(1, 14), schema=min_sep_schemas, seed=st.integers(0, 2**31))
def test_vec_sens_matches_brute_force(n, schema, seed):
  v = np.random.default_rng(seed).normal(size=n)
  expected = max([0.0] + [float(np.sum(v[list(p)])) for p in patterns_lib.all_patterns(schema, n)])
  got = sensitivity.vec_sens(v, schema.min_sep, schema.max_participations)
  assert got == pytest.approx(expected, abs=1e-12)


def test_vec_sens_small_examples():
  assert sensitivity.vec_sens([1.0, 1.0, 1.0, 1.0], 2, None) == 2.0
  assert sensitivity.vec_sens([-1.0, -2.0], 1, 2) == 0.0  # empty pattern
  assert sensitivity.vec_sens([3.0, 5.0, 3.0], 2, 2) == 6.0  # 0 and 2 beat 1 alone
  assert sensitivity.vec_sens([3.0, 5.0, 3.0], 2, 1) == 5.0


def _banded_lower(rng, n, bands):
  c = np.tril(rng.normal(size=(n, n)))
  c[np.subtract.outer(np.arange(n), np.arange(n)) >= bands] = 0.0
  return c


@SETTINGS
@hypothesis.given(n=st.integers(1, 12), schema=schemas, seed=st.integers(0, 2**31),
                  data=st.data())
def test_banded_is_exact(n, schema, seed, data):
  bands = data.draw(st.integers(1, schema.min_sep))
  c = _banded_lower(np.random.default_rng(seed), n, bands)
  lower, upper = brute_force(c, schema)
  assert lower == pytest.approx(upper, rel=1e-9)  # X_pi diagonal: truth known
  assert sensitivity.banded_squared(c, schema) == pytest.approx(lower, rel=1e-9)
  assert sensitivity.dense_squared(c, schema) == pytest.approx(lower, rel=1e-9)
  assert sensitivity.dense_squared_is_exact(c, schema)
  if not schema.fixed_epoch:  # Alg. 4 stays a bound; it need not be tight even for banded C
    assert sensitivity.min_sep_upper_bound_squared(c, schema) >= lower * (1 - 1e-9)


def test_alg4_is_not_tight_for_banded_gram():
  # Bands 2 <= b = 2; X = [[10, 3, 0], [3, 10, 3], [0, 3, 1]]. Exact: rounds {0, 2} give 10 + 1.
  # Alg. 4: row 1 picks |X_10| + |X_12| = 6 (columns 2 apart), so rows {0, 2} and 1 give 10 + 3 = 13.
  c = np.array([[1.0, 0.0, 0.0], [3.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
  schema = P.b_min_sep(2)
  assert brute_force(c, schema) == pytest.approx((11.0, 11.0))
  assert sensitivity.banded_squared(c, schema) == pytest.approx(11.0)
  assert sensitivity.min_sep_upper_bound_squared(c, schema) == pytest.approx(13.0)


def test_banded_accepts_non_lower_triangular_orthogonal_columns():
  # Column 2 lives above column 0 (the support test fails) but they are orthogonal (Gram check passes).
  c = np.array([[0.0, 0.0, 3.0], [2.0, 2.0, 0.0], [0.0, 1.0, 0.0]])
  schema = P.b_min_sep(2, 2)
  assert sensitivity.banded_squared(c, schema) == pytest.approx(13.0)  # columns 0, 2: 4 + 9
  assert brute_force(c, schema) == pytest.approx((13.0, 13.0))


def test_banded_rejects_overlapping_columns():
  c = np.tril(np.ones((5, 5)))
  with pytest.raises(ValueError, match='strategy_matrix'):
    sensitivity.banded_squared(c, P.b_min_sep(2, 2))
  # A single participation never pairs two columns: any C is fine.
  assert sensitivity.banded_squared(c, P.single()) == 5.0


@SETTINGS
@hypothesis.given(n=st.integers(1, 12), schema=schemas, seed=st.integers(0, 2**31),
                  nonnegative=st.booleans(), rows=st.integers(1, 14))
def test_alg4_is_an_upper_bound(n, schema, seed, nonnegative, rows):
  rng = np.random.default_rng(seed)
  c = rng.normal(size=(rows, n))
  if nonnegative:
    c = np.abs(c)
  lower, upper = brute_force(c, schema)
  bound = sensitivity.min_sep_upper_bound_squared(c, schema)
  assert bound >= upper * (1 - 1e-12)  # Alg. 4 >= Eq. 5 >= truth
  assert bound >= lower * (1 - 1e-12)  # and >= a value the adversary attains
  if nonnegative:
    assert lower == pytest.approx(upper, rel=1e-12)  # X >= 0: truth is max ||C u(pi)||^2


@SETTINGS
@hypothesis.given(n=st.integers(1, 12), k=st.integers(1, 4), b=st.integers(1, 4),
                  seed=st.integers(0, 2**31), nonnegative=st.booleans())
def test_fixed_epoch(n, k, b, seed, nonnegative):
  schema = P.fixed_epoch_order(k, b)
  c = np.tril(np.random.default_rng(seed).normal(size=(n, n)))
  if nonnegative:
    c = np.abs(c)
  lower, upper = brute_force(c, schema)
  value = sensitivity.fixed_epoch_squared(c, schema)
  assert value == pytest.approx(upper, rel=1e-12)
  if sensitivity.fixed_epoch_is_exact(c, schema):
    assert value == pytest.approx(lower, rel=1e-12)
  if nonnegative:
    assert sensitivity.fixed_epoch_is_exact(c, schema)
  assert sensitivity.dense_squared(c, schema) >= lower * (1 - 1e-12)


def test_fixed_epoch_requires_fixed_epoch_schema():
  with pytest.raises(ValueError, match='participation'):
    sensitivity.fixed_epoch_squared(np.eye(3), P.b_min_sep(1, 2))


def _monotone_coefs(rng, length):
  return np.sort(rng.uniform(0, 1, size=length))[::-1]


@SETTINGS
@hypothesis.given(n=st.integers(1, 14), schema=schemas, length=st.integers(1, 16),
                  seed=st.integers(0, 2**31))
def test_toeplitz_exact_for_monotone_coefficients(n, schema, length, seed):
  coefs = _monotone_coefs(np.random.default_rng(seed), length)
  lower, upper = brute_force(toeplitz.materialize(coefs, n), schema)
  assert lower == pytest.approx(upper, rel=1e-12)  # C >= 0
  assert sensitivity.toeplitz_is_exact(coefs, n, schema)
  assert sensitivity.toeplitz_squared(coefs, n, schema) == pytest.approx(lower, rel=1e-12)


@SETTINGS
@hypothesis.given(n=st.integers(1, 12), schema=schemas, length=st.integers(1, 14),
                  seed=st.integers(0, 2**31), nonnegative=st.booleans())
def test_toeplitz_non_monotone_is_upper_bound(n, schema, length, seed, nonnegative):
  rng = np.random.default_rng(seed)
  coefs = rng.normal(size=length)
  if nonnegative:
    coefs = np.abs(coefs)
  lower, upper = brute_force(toeplitz.materialize(coefs, n), schema)
  value = sensitivity.toeplitz_squared(coefs, n, schema)
  assert value >= upper * (1 - 1e-12)
  if sensitivity.toeplitz_is_exact(coefs, n, schema):
    assert value == pytest.approx(lower, rel=1e-12)


def test_toeplitz_majorant_beats_earliest_pattern_value():
  # c = (1, 0, 0, 1), n = 7, b = 2: pi* = (0, 2) gives ||C u||^2 = 4, pattern (0, 3) gives 6.
  coefs = [1.0, 0.0, 0.0, 1.0]
  schema = P.b_min_sep(2, 2)
  c = toeplitz.materialize(coefs, 7)
  assert np.sum((c[:, 0] + c[:, 2])**2) == 4.0
  assert brute_force(c, schema) == (6.0, 6.0)
  assert not sensitivity.toeplitz_is_exact(coefs, 7, schema)
  assert sensitivity.toeplitz_squared(coefs, 7, schema) >= 6.0


@pytest.mark.parametrize('n,b,k,expected_sens', [(30, 7, 3, 3.279278511421676),
                                                 (40, 9, 4, 4.031994512368695),
                                                 (25, 5, 5, 4.603543602451992),
                                                 (4000, 400, 5, 4.883132)])
def test_toeplitz_published_blt_sensitivities(n, b, k, expected_sens):
  # Thm. 3.1 sensitivities of the BLT paper's App. A b=400 BLT (docs/papers.md#blt), computed from
  # its parameters (the last one is the App. A setting n=4000, b=400, k=5).
  i = np.arange(1, n)
  coefs = np.concatenate([[1.0], (OMEGA_400 * THETA_400**(i[:, None] - 1)).sum(axis=1)])
  value = sensitivity.toeplitz_squared(coefs, n, P.b_min_sep(b, k))
  assert np.sqrt(value) == pytest.approx(expected_sens, abs=1e-6)


@SETTINGS
@hypothesis.given(n=st.integers(1, 12), seed=st.integers(0, 2**31), rows=st.integers(1, 14))
def test_single_participation_matches_brute_force(n, seed, rows):
  c = np.random.default_rng(seed).normal(size=(rows, n))
  lower, upper = brute_force(c, P.single())
  assert lower == pytest.approx(upper, rel=1e-12)
  assert sensitivity.single_participation_squared(c) == pytest.approx(lower, rel=1e-12)
  assert sensitivity.dense_squared(c, P.single()) == pytest.approx(lower, rel=1e-12)
  assert sensitivity.dense_method(c, P.single()) == ('single', True)


def test_dense_method_choice():
  rng = np.random.default_rng(0)
  dense = np.tril(rng.normal(size=(8, 8)))
  banded = _banded_lower(rng, 8, 2)
  assert sensitivity.dense_method(banded, P.b_min_sep(2, 3)) == ('banded', True)
  assert sensitivity.dense_method(dense, P.b_min_sep(2, 3)) == ('min_sep_upper_bound', False)
  assert sensitivity.dense_method(np.abs(dense), P.fixed_epoch_order(2, 4)) == ('fixed_epoch', True)
  # Same k_eff = 1 with a large min_sep: single participation.
  assert sensitivity.dense_method(dense, P.b_min_sep(8, 3)) == ('single', True)
  assert sensitivity.dense_squared(dense, P.b_min_sep(2, 3)) == pytest.approx(
      sensitivity.min_sep_upper_bound_squared(dense, P.b_min_sep(2, 3)))


def test_alg4_chunking_is_invisible(monkeypatch):
  c = np.tril(np.random.default_rng(1).normal(size=(30, 30)))
  schema = P.b_min_sep(3, 4)
  whole = sensitivity.min_sep_upper_bound_squared(c, schema)
  monkeypatch.setattr(sensitivity, '_ALG4_ELEMENTS_PER_CHUNK', 70)  # 2 rows per chunk
  assert sensitivity.min_sep_upper_bound_squared(c, schema) == whole


def test_equal_norm_banded_is_k():
  # BandMF Thm. 2: unit column norms and bands <= b give sens^2 = min(k, ceil(n / b)).
  c = _banded_lower(np.random.default_rng(3), 50, 4)
  c /= np.linalg.norm(c, axis=0)
  assert sensitivity.banded_squared(c, P.b_min_sep(5, 3)) == pytest.approx(3.0)
  assert sensitivity.banded_squared(c, P.b_min_sep(5)) == pytest.approx(10.0)


@pytest.mark.parametrize('call,name', [
    (lambda: sensitivity.vec_sens([], 1, 1), 'vector'),
    (lambda: sensitivity.vec_sens([1.0, np.nan], 1, 1), 'vector'),
    (lambda: sensitivity.vec_sens([1.0], 0, 1), 'min_sep'),
    (lambda: sensitivity.vec_sens([1.0], 1, 0), 'max_participations'),
    (lambda: sensitivity.single_participation_squared(np.ones(3)), 'strategy_matrix'),
    (lambda: sensitivity.dense_squared(np.ones((2, 2)), 'single'), 'participation'),
    (lambda: sensitivity.dense_squared(np.full((2, 2), np.inf), P.single()), 'strategy_matrix'),
    (lambda: sensitivity.toeplitz_squared([1.0], 0, P.single()), 'num_rounds'),
    (lambda: sensitivity.toeplitz_squared([], 3, P.single()), 'coefs'),
    (lambda: sensitivity.min_sep_upper_bound_squared(np.ones((0, 3)), P.single()),
     'strategy_matrix'),
])
def test_invalid_inputs_name_the_parameter(call, name):
  with pytest.raises(ValueError, match=name):
    call()


def test_strided_window_sum_is_the_sum_of_shifted_copies():
  """The O(n) window sums (toeplitz_squared's C u(pi*)) equal the O(kn) loop over participations,
  for every (n, b, k) up to 24, with and without the blocks (k below or above the rows)."""
  rng = np.random.default_rng(0)
  for n in range(1, 25):
    values = rng.random(n)
    for b in range(1, n + 2):
      for k in range(1, -(-n // b) + 2):
        expected = np.zeros(n)
        for p in range(min(k, -(-n // b))):
          expected[p * b:] += values[:n - p * b]
        np.testing.assert_allclose(sensitivity.strided_window_sum(values, b, k), expected,
                                   rtol=1e-13, atol=0)


def test_toeplitz_sensitivity_is_linear_in_the_rounds():
  """10^6 rounds at min_sep 10 (k = 10^5 participations) in well under a second (the loop over
  participations took 15 s)."""
  import time
  coefs = 0.5**np.arange(20)
  start = time.perf_counter()
  value = sensitivity.toeplitz_squared(coefs, 10**6, participation_lib.ParticipationSchema(10))
  assert time.perf_counter() - start < 2
  assert value > 0
