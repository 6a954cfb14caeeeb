"""Every restart flag with every streaming mechanism, fixed and adaptive clipping, through the TFF
aggregation process: the noise and the clip restart exactly on the rounds the plan says.

Each case builds `CorrelatedNoiseFactory(plan, noise_seed=...)` from a `RunPlan` whose schedule is
the one the flag gives (`dp_ftrl_tff.settings.RestartSchedule.of`, what the drivers and the privacy
report call), runs `NUM_ROUNDS` rounds on zero client updates (so the result is the noise over m)
and compares with numpy references rebuilt independently of the process:
  * the model noise with stddev * blockdiag(M_1, M_2, ...) @ Z, M_i = `strategy.noise_matrix(m_i)`
    per segment and Z's rows counted on across segments (`tests/testing/streams.py`);
  * with adaptive clipping, the quantile estimate of Andrew et al.'s geometric update whose count
    noise is the same block-diagonal product on the count stream's seed lineage (so the count noise
    restarts with the model noise), and the clip, which takes the estimate only at a restart;
  * the measurements `round`, `segment` and `restart` (round t's `restart` says round t + 1 starts
    a segment).
"""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import settings
from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory, adaptive_clipping
from dp_ftrl_tff.mechanisms import banded, blt, gaussian, square_root, tree
from dp_ftrl_tff.noise import base
from tests.testing import streams

pytestmark = pytest.mark.integration

NUM_ROUNDS = 6
SEED = 29
CLIENTS = 3
DIM = 3
NOISE_MULTIPLIER = 0.5
ADAPTIVE = settings.AdaptiveClipping(initial_clip=1.0, clip_learning_rate=0.3,
                                     clipped_count_stddev=0.4)

#: The mechanisms with a streaming noise state (the registry's, but TreeAgg-Full, which decodes
#: offline), each with a small strategy; Gaussian noise restarts nothing but the clip.
STRATEGIES = {
    'tree': tree.TreeStrategy('vanilla'),
    'tree_efficient': tree.TreeStrategy('efficient'),
    'banded': banded.BandedStrategy.from_toeplitz([1.0, 0.5, 0.25], num_rounds=NUM_ROUNDS),
    'blt': blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2)),
    'bsr': square_root.BandedSquareRootStrategy(2),
    'bisr': square_root.BandedInverseSquareRootStrategy(2),
    'gaussian': gaussian.GaussianStrategy(),
}

#: flag -> (the plan's restart keywords as the flag gives them, the restart rounds they must give
#: over NUM_ROUNDS + 1 rounds: the last round's `restart` announces round NUM_ROUNDS).
SCHEDULES = {
    '--restart_rounds=2,5': (dict(restarts=settings.RestartSchedule.of((2, 5), None, None)), (2, 5)),
    '--restart_period=2': (dict(restarts=settings.RestartSchedule.of(None, None, 2)), (2, 4, 6)),
    '--restart_warmup=1 --restart_period=3': (dict(restarts=settings.RestartSchedule.of(None, 1, 3)),
                                              (1, 4)),
}
#: A banded strategy of 4 rounds run for 6 with `--banded_beyond_max_rounds=restart`.
BEYOND = ('--banded_beyond_max_rounds=restart',
          dict(beyond_max_rounds='restart',
               strategy=banded.BandedStrategy.from_toeplitz([1.0, 0.5], num_rounds=4)), (4,))


def _cases():
  """Every (mechanism, flag) pair, the clipping alternating over them so that each mechanism and
  each flag runs with both (every pair of the three factors; the full product costs twice the
  time for checks the pairs already make: the schedule does not depend on the mechanism, the
  noise's restart not on the flag)."""
  for i, mechanism in enumerate(STRATEGIES):
    for j, flag in enumerate(SCHEDULES):
      adaptive = (i + j) % 2 == 0
      yield pytest.param(mechanism, flag, adaptive,
                         id=f'{mechanism}-{flag}-{"adaptive" if adaptive else "fixed"}')
  for adaptive in (False, True):
    yield pytest.param('banded', BEYOND[0], adaptive,
                       id=f'banded-{BEYOND[0]}-{"adaptive" if adaptive else "fixed"}')
  # `--restart_rounds=` with no round (RestartSchedule.at(())): never, not adaptive clipping's
  # default schedule.
  yield pytest.param('blt', '--restart_rounds=', True, id='blt-no-restart-rounds-adaptive')


def _plan(mechanism, flag, adaptive):
  if flag == BEYOND[0]:
    keywords, expected = dict(BEYOND[1]), BEYOND[2]
  elif flag == '--restart_rounds=':
    keywords, expected = dict(restarts=settings.RestartSchedule.at(())), ()
  else:
    keywords, expected = dict(SCHEDULES[flag][0]), SCHEDULES[flag][1]
  strategy = keywords.pop('strategy', STRATEGIES[mechanism])
  plan = plan_lib.RunPlan.build(strategy, NOISE_MULTIPLIER, CLIENTS, 1.0,
                                adaptive_clip=ADAPTIVE if adaptive else None,
                                num_rounds=NUM_ROUNDS, **keywords)
  return plan, expected


def _dense(strategy, lengths, specs, seed):
  """blockdiag(noise_matrix(m) per segment) @ Z on `seed`'s lineage: [rounds, coordinates]."""
  reference, _ = streams.expected_stream(strategy.noise_matrix, lengths, specs, seed)
  return streams.flat(reference)


def _lengths(restarts):
  bounds = [0, *restarts, NUM_ROUNDS]
  return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.mark.parametrize('mechanism,flag,adaptive', list(_cases()))
def test_noise_and_clip_restart_where_the_plan_says(mechanism, flag, adaptive):
  plan, announced = _plan(mechanism, flag, adaptive)
  restarts = tuple(r for r in announced if r < NUM_ROUNDS)
  # The plan's segments are the flag's (the accountant and the drivers' momentum reset read them).
  assert plan.restart_rounds(NUM_ROUNDS + 1) == list(announced)
  assert plan.planned_segments.restart_rounds == restarts
  process = CorrelatedNoiseFactory(plan, noise_seed=SEED).create(
      tff.TensorType(np.float32, [DIM]))
  state = process.initialize()
  outputs = []
  for _ in range(NUM_ROUNDS):
    output = process.next(state, [np.zeros(DIM, np.float32)] * CLIENTS)
    state = output.state
    outputs.append(output)
  m = [output.measurements for output in outputs]

  assert [int(x['round']) for x in m] == list(range(NUM_ROUNDS))
  assert [bool(x['restart']) for x in m] == [t + 1 in announced for t in range(NUM_ROUNDS)]
  assert [int(x['segment']) for x in m] == [sum(t >= r for r in restarts)
                                           for t in range(NUM_ROUNDS)]

  # The clip: the estimate after round r - 1 at each restart round r, else unchanged.
  seed = base.initial_seed(SEED)
  estimates, clips = _expected_clips(plan, restarts, seed)
  np.testing.assert_allclose([float(x['clip']) for x in m], clips, rtol=1e-5)
  np.testing.assert_allclose([float(x['quantile_estimate']) for x in m], estimates, rtol=1e-5)
  if adaptive and restarts:
    assert clips[restarts[0]] != clips[0]  # the clip did move at the restart
  np.testing.assert_allclose([float(x['noise_stddev']) for x in m],
                             [plan.value_noise_multiplier * c for c in clips], rtol=1e-5)

  # The model noise restarts with the segments: blockdiag(M_i) @ Z with Z's rows counted on.
  got = np.stack([np.asarray(o.result, np.float64) * CLIENTS for o in outputs])
  got /= np.asarray([float(x['noise_stddev']) for x in m])[:, None]
  expected = _dense(plan.strategy, _lengths(restarts), tf.TensorSpec([DIM], tf.float32), seed)
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
  # ... and not as one segment would (a restart that did nothing would pass the clip checks).
  if restarts and plan.strategy.correlated and plan.strategy.max_rounds is None:
    whole = _dense(plan.strategy, [NUM_ROUNDS], tf.TensorSpec([DIM], tf.float32), seed)
    assert not np.allclose(got[restarts[0]:], whole[restarts[0]:], rtol=1e-3, atol=1e-3)


def _expected_clips(plan, restarts, seed):
  """(quantile estimate after each round, the clip of each round), in numpy. Every update is zero,
  so every client is below the estimate: the centred count sum is m / 2 plus the count noise."""
  clip = plan.clip_norm
  if plan.adaptive_clip is None:
    return [clip] * NUM_ROUNDS, [clip] * NUM_ROUNDS
  count_noise = plan.clipped_count_stddev * _dense(
      plan.strategy, _lengths(restarts), tf.TensorSpec([], tf.float32),
      adaptive_clipping.count_seed(seed))[:, 0]
  estimate, estimates, clips = clip, [], []
  for t in range(NUM_ROUNDS):
    if t in restarts:
      clip = estimate
    clips.append(clip)
    below = min(1.0, max(0.0, (CLIENTS / 2 + count_noise[t]) / CLIENTS + 0.5))
    estimate *= math.exp(-plan.adaptive_clip.clip_learning_rate
                         * (below - plan.adaptive_clip.target_unclipped_quantile))
    estimates.append(estimate)
  return estimates, clips


@pytest.mark.unit
@pytest.mark.parametrize('schedule,expected', [
    (settings.RestartSchedule.at((3,)), [3]),
    (settings.RestartSchedule.at((2, 5, 9)), [2, 5, 9]),
    (settings.RestartSchedule.at(()), []),
    (settings.RestartSchedule(warmup=0, period=4), [4, 8]),
], ids=['rounds_3', 'rounds_2_5_9', 'no_rounds', 'period_4'])
def test_restart_round_is_the_schedules_rounds_in_graph(schedule, expected):
  # In a graph, as the aggregator's server step calls it (the round is a tensor there).
  flags = tf.function(lambda r: adaptive_clipping.is_restart_round(schedule, r))
  assert [r for r in range(12) if bool(flags(tf.constant(r, tf.int64)))] == expected
  assert schedule.restart_rounds(12) == expected
