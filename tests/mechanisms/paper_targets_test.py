"""Published figures reproduced with the core helpers (gaussian, toeplitz, sensitivity, tree).

Sources: BandMF paper Table 2 (n = 2052, k = 6, b = 342; docs/papers.md#bandmf) and the BLT paper's
App. A production BLTs with the losses and sensitivities of its Table 4 rows (docs/papers.md#blt).
BLT coefficients are written out here from Eq. 2 (c_0 = 1, c_i = sum_j omega_j theta_j^(i-1)), not
taken from blt.py.
"""

import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import gaussian, sensitivity, toeplitz, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

P = participation_lib.ParticipationSchema

APP_A = {
    100: ((0.989739971007307, 0.7352001759538236, 0.16776199983448145, 0.1677619998016191),
          (0.20502892852480875, 0.23357939425278557, 0.03479503245420878, 0.03479509876050538)),
    400: ((0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778),
          (0.0070314825502323835, 0.10613806907600574, 0.1898159060327625, 0.1966594748073734)),
    1000: ((0.9999999999983397, 0.9973412136664378, 0.9584629472313878, 0.6581796870749317),
           (0.008657392263671862, 0.05890891298180163, 0.14548176930698697, 0.2770117005326523)),
}


def _coefs(key, n):
  theta, omega = (np.array(v) for v in APP_A[key])
  i = np.arange(1, n)[:, None]
  return np.concatenate([[1.0], np.sum(omega * theta**(i - 1), axis=1)])


def test_bandmf_table2_dp_sgd():
  # DP-SGD prefix-sum RMSE sqrt(k (n + 1) / 2) = 78.48; relative to Multi-epoch MF (8.1523): 9.63.
  losses = gaussian.GaussianStrategy().losses(2052, P.b_min_sep(342, 6))
  assert losses.rms_loss == pytest.approx(78.48, abs=0.005)
  assert losses.rms_loss / 8.1523 == pytest.approx(9.63, abs=0.005)
  assert losses.sensitivity_squared == 6.0


def test_bandmf_table2_tree_pseudo_inverse_ratio_to_dp_sgd():
  # Table 2: optimal TreeAgg (pseudo-inverse decoder) RMSE 1.53 and DP-SGD 9.63, both relative to
  # Multi-epoch MF, with sensitivity 1 under min-sep; the ratio is normalization-free.
  schema = P.b_min_sep(342, 6)
  tree_rms = tree.TreeStrategy('full').losses(2052, schema).rms_loss
  dp_sgd_rms = gaussian.GaussianStrategy().losses(2052, schema).rms_loss
  assert tree_rms / dp_sgd_rms == pytest.approx(1.53 / 9.63, rel=0.01)


@pytest.mark.parametrize('key,n,b,k,sens,max_loss,rms_loss', [
    (100, 2000, 100, 10, 7.686141, 18.84705, 15.24772),
    (400, 4000, 400, 5, 4.883132, 10.67219, 9.74017),
    (1000, 4000, 1000, 2, 2.833428, 5.68435, 5.33955),
])
def test_blt_app_a_losses(key, n, b, k, sens, max_loss, rms_loss):
  coefs = _coefs(key, n)
  schema = P.b_min_sep(b, k)
  assert sensitivity.toeplitz_is_exact(coefs, n, schema)
  sens_sq = sensitivity.toeplitz_squared(coefs, n, schema)
  max_error, rms_error = toeplitz.errors_from_noise_coefs(toeplitz.inverse_coefs(coefs, n))
  assert np.sqrt(sens_sq) == pytest.approx(sens, abs=2e-6)
  assert max_error * np.sqrt(sens_sq) == pytest.approx(max_loss, abs=2e-5)
  assert rms_error * np.sqrt(sens_sq) == pytest.approx(rms_loss, abs=2e-5)


@pytest.mark.parametrize('key,n,b,k,sens', [
    (400, 1280, 300, 4, 4.0889),   # es-ES
    (400, 2350, 447, 5, 4.6081),   # id-ID
    (1000, 2000, 2001, 1, 1.8323),  # pt-BR BLT-8.681
    (1000, 2000, 1181, 2, 2.6884),  # pt-BR BLT-16.1
])
def test_blt_table4_sensitivities(key, n, b, k, sens):
  value = sensitivity.toeplitz_squared(_coefs(key, n), n, P.b_min_sep(b, k))
  assert np.sqrt(value) == pytest.approx(sens, abs=1e-4)
