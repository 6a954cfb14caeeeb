"""The drivers' console lines from a plan, without training: the header states the clip, the noise
seed (a fixed one flagged testing-only), the sampler, clients per round, sampling probability and
population; an eval line says "no client participated twice yet" instead of a min_sep that would
read as a violation."""

import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff import settings
from dp_ftrl_tff.accounting import participation_log, zcdp
from dp_ftrl_tff.mechanisms import gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.training import console

pytestmark = pytest.mark.unit

Schema = participation_lib.ParticipationSchema


def _plan(**kwargs):
  args = dict(num_rounds=10, participation=Schema(5, 2), target_delta=1e-6)
  args.update(kwargs)
  return plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, args.pop('clients_per_round', 10),
                                args.pop('clip_norm', 1.0), **args)


def _header(plan, *args, **kwargs) -> str:
  """The header of `plan` with its planned guarantee, as a run prints it."""
  planned = (None if plan.noise_multiplier == 0 else
             zcdp.planned_guarantee(plan, conversion=console.CONVERSION))
  return console.header(plan, planned, *args, **kwargs)


def _line(header: str, label: str) -> str:
  (line,) = [line for line in header.splitlines() if line.startswith(label + ' ')]
  return line


def test_header_flags_a_fixed_noise_seed_as_testing_only():
  header = _header(_plan(noise_seed_fixed=True, population=100), 'synthetic', '/tmp/run')
  assert _line(header, 'seed') == f'seed        {console.FIXED_SEED_TEXT}'
  assert 'TESTING ONLY' in console.FIXED_SEED_TEXT and '--noise_seed' in console.FIXED_SEED_TEXT
  secret = _header(_plan(noise_seed_fixed=False, population=100), 'synthetic', '/tmp/run')
  assert _line(secret, 'seed') == 'seed        noise seed drawn from OS entropy (secret)'
  assert 'not recorded' in _line(_header(_plan(), 'synthetic', '/tmp/run'), 'seed')


def test_header_states_the_clip():
  fixed = _header(_plan(clip_norm=0.5), 'synthetic', '/tmp/run')
  assert 'clip 0.5 (fixed)' in _line(fixed, 'noise')
  adaptive = settings.AdaptiveClipping(target_unclipped_quantile=0.7, clipped_count_stddev=2.0)
  header = _header(_plan(clients_per_round=50, clip_norm=0.2, adaptive_clip=adaptive),
                          'synthetic', '/tmp/run')
  assert 'clip 0.2 (initial; adaptive to the unclipped quantile 0.7)' in _line(header, 'noise')


def test_header_states_sampler_cohorts_and_population():
  schedule = _line(_header(_plan(population=1000), 'synthetic', '/tmp/run'), 'schedule')
  assert schedule.startswith('schedule    min-sep sampler, 10 clients per round, 10 rounds, '
                             'min_sep 5, max_participations 2')
  assert schedule.endswith('; population 1000 clients (0.01 of them per round)')
  sampling = sampling_lib.Sampling('cyclic_poisson', 0.3, 2, population=30)
  sampled = plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, None, 1.0, sampling=sampling,
                                   num_rounds=4, participation=Schema(2), target_delta=1e-6)
  schedule = _line(_header(sampled, 'synthetic', '/tmp/run'), 'schedule')
  assert 'cyclic_poisson sampling q=0.3, 2 groups, expected 4.5 clients per round' in schedule
  assert schedule.endswith('; population 30 clients (0.15 of them per round)')


@pytest.mark.parametrize('rows, rounds_done, expected, absent', [
    ([('a', 0), ('b', 1), ('c', 2)], 3, 'no client participated twice yet', 'min_sep 3'),
    ([('a', 0), ('b', 1), ('a', 6)], 7, 'min_sep 6, max_participations 2', 'twice'),
])
def test_eval_line_says_when_no_client_participated_twice(tmp_path, rows, rounds_done, expected,
                                                          absent):
  path = str(tmp_path / 'participation.csv')
  writer = participation_log.ParticipationLogWriter(path)
  for client, round_num in rows:
    writer.append_round(round_num, [client])
  guarantee = console.spent_guarantee(_plan(), path, rounds_done)
  line = console.eval_line(rounds_done, 10, {'eval_loss': 0.5}, guarantee)
  assert f'(observed participation: {expected})' in line and absent not in line, line


def test_header_warns_when_the_noise_dwarfs_the_update():
  # sigma sqrt(d) / m: 1 * sqrt(7850) / 10 = 8.86 > 3 (the tiny model's loss rises at the driver's
  # defaults); 30 clients per round bring it to 2.95.
  plan = _plan()
  assert console.noise_to_signal(plan, 7850) == pytest.approx(7850 ** 0.5 / 10, rel=1e-12)
  warning = _line(_header(plan, 'synthetic', '/tmp/run', num_params=7850), 'warning')
  assert 'noise 8.86x the update per coordinate' in warning
  assert '>= 30 clients per round' in warning and '--noise_multiplier=0' in warning
  assert 'warning' not in _header(_plan(clients_per_round=30), 'synthetic', '/tmp/run',
                                         num_params=7850)
  assert 'warning' not in _header(plan, 'synthetic', '/tmp/run')  # model size unknown
