"""Tests for `dp_ftrl_tff.accounting.adaptive_clipping` against the Gboard paper's Thm. 1 values."""

import math

import pytest

from dp_ftrl_tff.accounting import adaptive_clipping


@pytest.mark.parametrize('z, sigma_b, expected', [
    (7.0, 325.0, 7.000405952470763),  # report goal 6500, sigma_b = 6500 / 20 (notes/seed003_004.md)
    (0.54, 25.0, 0.540031495555258),  # report goal 500
    (7.0, 25.0, 7.069625178409298),
])
def test_inflated_noise_multiplier_matches_notes(z, sigma_b, expected):
  assert adaptive_clipping.inflated_noise_multiplier(z, sigma_b) == pytest.approx(expected, rel=1e-14)


def test_inflation_composes_to_the_accounted_zcdp():
  # zCDP of the two releases (model sum, sensitivity 1; centred count, sensitivity 1/2) adds up.
  z, sigma_b = 3.0, 4.0
  z_delta = adaptive_clipping.inflated_noise_multiplier(z, sigma_b)
  rho_total = 1 / (2 * z_delta**2) + 0.5**2 / (2 * sigma_b**2)
  assert rho_total == pytest.approx(1 / (2 * z**2), rel=1e-13)


def test_accounted_noise_multiplier_inverts_inflation():
  z_delta = adaptive_clipping.inflated_noise_multiplier(7.0, 325.0)
  assert adaptive_clipping.accounted_noise_multiplier(z_delta, 325.0) == pytest.approx(7.0, rel=1e-14)
  assert adaptive_clipping.accounted_noise_multiplier(7.0, 325.0) < 7.0


@pytest.mark.parametrize('z, sigma_b, name', [
    (7.0, 3.5, 'noise_multiplier'),  # z == 2 sigma_b
    (8.0, 3.5, 'noise_multiplier'),
    (0.0, 3.5, 'noise_multiplier'),
    (1.0, -1.0, 'clipped_count_stddev'),
    (1.0, math.inf, 'clipped_count_stddev'),
])
def test_inflated_noise_multiplier_rejects_bad_input(z, sigma_b, name):
  with pytest.raises(ValueError, match=name):
    adaptive_clipping.inflated_noise_multiplier(z, sigma_b)
