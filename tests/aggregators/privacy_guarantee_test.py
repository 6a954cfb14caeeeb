"""`CorrelatedNoiseFactory.privacy_guarantee`: the factory's plan, accounted by `plan_guarantee`."""

import math

import dp_accounting
import pytest

from dp_ftrl_tff import accounting
from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
from dp_ftrl_tff.mechanisms import blt

pytestmark = pytest.mark.unit


def test_gaussian_factory_guarantee_is_the_independent_event():
  factory = CorrelatedNoiseFactory.gaussian(noise_multiplier=8.0, clients_per_round=10,
                                            clip_norm=1.0)
  g = factory.privacy_guarantee(rounds=50, min_sep=10, max_participations=4, delta=1e-6)
  # DP-SGD: sens^2 = k = 4 participations, so the run is one Gaussian with multiplier 8 / 2.
  accountant = dp_accounting.pld.PLDAccountant()
  accountant.compose(dp_accounting.GaussianDpEvent(8.0 / math.sqrt(4)))
  assert g.rho == pytest.approx(4 / (2 * 8.0**2), rel=1e-12)
  # PLD's discretization interval 1e-4 bounds the difference of two roundings of one Gaussian.
  assert g.epsilon == pytest.approx(accountant.get_epsilon(1e-6), abs=1e-4)


def test_blt_factory_with_adaptive_clipping_and_secagg_delegates_to_plan_guarantee():
  factory = CorrelatedNoiseFactory.blt(noise_multiplier=6.0, clients_per_round=100, clip_norm=None,
                                       strategy=blt.PRODUCTION_STRATEGIES[400], adaptive_clip=True,
                                       secure=16)
  g = factory.privacy_guarantee(rounds=2000, min_sep=400, max_participations=5, delta=1e-6)
  assert g == accounting.plan_guarantee(factory.plan, rounds=2000, min_sep=400,
                                        max_participations=5, delta=1e-6)
  assert g.guarantee.restart_rounds == (128, 1152)  # the Gboard schedule of adaptive clipping
  assert g.rho_count > 0 and g.rho == pytest.approx(g.rho_value + g.rho_count, rel=1e-12)
  accountant = dp_accounting.pld.PLDAccountant()
  accountant.compose(g.dp_event)
  assert accountant.get_epsilon(1e-6) == g.epsilon
