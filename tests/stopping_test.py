"""The library's long computations call the installed stop check (`dp_ftrl_tff.stopping`) and stop
where it raises; without one they run as before. Tiny sizes: each stops at its first points."""

import numpy as np
import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import stopping
from dp_ftrl_tff.accounting import (
  amplification,
  calibration,
  equal_privacy,
  monte_carlo,
  zcdp_epsilon,
)
from dp_ftrl_tff.mechanisms import banded_optimizer, blt
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.programs import data_source

pytestmark = pytest.mark.unit

PARTICIPATION = participation_lib.ParticipationSchema.b_min_sep(4, 3)


class Stop(Exception):
  pass


class StopAt:
  """A check that raises `Stop` at its `at`-th call."""

  def __init__(self, at: int):
    self.at, self.calls = at, 0

  def __call__(self):
    self.calls += 1
    if self.calls >= self.at:
      raise Stop()


COMPUTATIONS = {
    'optimize_blt': lambda: blt.optimize_blt(16, PARTICIPATION, num_buffers=2),
    'optimize_banded': lambda: banded_optimizer.optimize_banded(16, 4, PARTICIPATION),
    'calibration (pld)': lambda: calibration.noise_multiplier_for_epsilon(
        2.0, 3.0, 1e-6, conversion='pld'),
    'amplified calibration': lambda: amplification.amplified_noise_multiplier(
        4.0, 16, 4, 0.1, 1e-6),
    'epsilons (pld)': lambda: [zcdp_epsilon.epsilon_from_rho(rho, 1e-6) for rho in (0.5, 1.0)],
    'equal_privacy': lambda: equal_privacy.equal_privacy(16, PARTICIPATION, rho=0.5),
    'monte_carlo_epsilon': lambda: monte_carlo.monte_carlo_epsilon(
        np.eye(8), 1.0, sampling='balls_in_bins', bands=4, delta=1e-5, num_samples=1000,
        seed=0, num_rounds=8),
}


@pytest.mark.parametrize('name', sorted(COMPUTATIONS))
def test_a_long_computation_stops_where_the_check_raises(name):
  check = StopAt(2)
  with stopping.stop_check(check), pytest.raises(Stop):
    COMPUTATIONS[name]()
  assert check.calls == 2


def test_the_check_is_installed_for_the_block_only():
  outer, inner = StopAt(1), StopAt(1)
  stopping.check()
  with stopping.stop_check(outer):
    with stopping.stop_check(inner), pytest.raises(Stop):
      stopping.check()
    with stopping.stop_check(None):
      stopping.check()
    with pytest.raises(Stop):
      stopping.check()
  stopping.check()
  assert (outer.calls, inner.calls) == (1, 1)
  with pytest.raises(ValueError, match='`fn` must be callable'):
    with stopping.stop_check('stop'):
      pass


def test_the_data_source_stops_before_a_round_and_resumes_unchanged(tmp_path):
  ids = [f'c{i}' for i in range(8)]
  plan = plan_lib.RunPlan.build(
      blt.BLTStrategy(theta=(0.9,), omega=(0.3,)), 1.0, 2, 1.0, num_rounds=4,
      population=len(ids), participation=participation_lib.ParticipationSchema.b_min_sep(2))
  log = tmp_path / 'participation.csv'
  source = data_source.SampledClientDataSource(ids, plan, str(log), seed=3)
  iterator = source.iterator()
  iterator.select(2)
  before = (iterator.to_bytes(), log.read_bytes())
  with stopping.stop_check(StopAt(1)), pytest.raises(Stop):
    iterator.select(2)
  assert (iterator.to_bytes(), log.read_bytes()) == before
  second = iterator.select(2)
  uninterrupted = data_source.SampledClientDataSource(ids, plan, str(tmp_path / 'other.csv'),
                                                      seed=3).iterator()
  uninterrupted.select(2)
  assert uninterrupted.select(2) == second
