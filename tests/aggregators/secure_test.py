"""SecAgg settings: validation, padded dimension, scale factor and the inflated L2 bound."""

import math

import numpy as np
import pytest

from dp_ftrl_tff.aggregators import secure


@pytest.mark.parametrize('kwargs, name', [({'bits': 0}, 'bits'), ({'bits': 23}, 'bits'),
                                          ({'rotation': 'fft'}, 'rotation'),
                                          ({'beta': 1.0}, 'beta'),
                                          ({'modclip_prob': 0.0}, 'modclip_prob')])
def test_invalid_settings_are_named(kwargs, name):
  with pytest.raises(ValueError, match=name):
    secure.SecureAggregation(**kwargs)


def test_padded_dim():
  assert secure.SecureAggregation(rotation='hd').padded_dim(5) == 8
  assert secure.SecureAggregation(rotation='dft').padded_dim(5) == 6
  assert secure.SecureAggregation(rotation=None).padded_dim(5) == 5


def test_scale_factor_fits_the_field_at_k_stddevs():
  config = secure.SecureAggregation(bits=16, rotation='dft', modclip_prob=1e-4)
  clip, n, dim = 0.5, 100, 10_000
  scale = config.scale_factor(clip, n, dim)
  gamma = 1.0 / scale
  # k stddevs of the aggregate (sub-Gaussian, all clients aligned) span exactly the field.
  k = 3.890591886413094  # sqrt(2) erfcinv(1e-4), from a table of the normal quantile.
  d = config.padded_dim(dim)
  span = 2 * k * math.sqrt(clip**2 * n**2 / d + gamma**2 * n / 4)
  np.testing.assert_allclose(span, 2.0**16 * gamma, rtol=1e-6)


def test_scale_factor_without_rotation_is_worst_case():
  config = secure.SecureAggregation(bits=12, rotation=None)
  scale = config.scale_factor(1.0, 10, 50)
  # n * (clip * scale + 1) = 2^(bits - 1).
  np.testing.assert_allclose(10 * (scale + 1), 2**11)


def test_too_few_bits_is_named():
  with pytest.raises(ValueError, match='bits'):
    secure.SecureAggregation(bits=4, rotation=None).scale_factor(1.0, 100, 10)


def test_inflated_clip_matches_the_ddg_bound():
  # Kairouz et al. 2021, Thm. 1 with beta = 0: ||rounded|| <= c + gamma sqrt(d).
  bound = float(secure.inflated_clip(1.0, 0.01, 0.0, 400).numpy())
  np.testing.assert_allclose(bound, 1.0 + 0.01 * 20 + secure.NORM_LEEWAY, rtol=1e-6)
  # beta > 0: sqrt(c^2 + gamma^2 d / 4 + sqrt(2 log(1/beta)) gamma (c + gamma sqrt(d) / 2)).
  beta = math.exp(-0.5)
  expected = math.sqrt(1.0 + 0.25 * 0.2**2 + 1.0 * 0.01 * (1.0 + 0.1))
  bound = float(secure.inflated_clip(1.0, 0.01, beta, 400).numpy())
  np.testing.assert_allclose(bound, min(expected, 1.2) + secure.NORM_LEEWAY, rtol=1e-6)
