"""The run settings that interact, pair by pair: mechanism x sampler x clipping x restarts x SecAgg x
canaries, and one combination's run, the drivers' way, for 3 rounds.

The full product (7 x 3 x 2 x 3 x 2 x 2 = 504 combinations, 210 of them allowed) would take an
hour; a pairwise (all-pairs) covering design runs every pair of values of two factors in at least
one combination. `EXISTING` lists what other tests already run, `COMBINATIONS` only the
combinations for the pairs nothing else runs (16: every pair of a mechanism and a Poisson sampler
or SecAgg is its own combination, so none can be saved); `uncovered_pairs` checks the two together.
docs/TESTING.md ("Interacting settings") lists the design;
tests/experiments/interactions_test.py runs the combinations without SecAgg and checks the design,
tests/experiments/interactions_secure_test.py runs those with SecAgg.

`run_and_check(combination, root)`: a tiny EMNIST `RunConfig` -> `run_start.start_run` (the drivers'
and the train_model program's one start: strategy, plan, canaries, DP-FTRL process) -> the
drivers' sampler (`sampling.make_sampler`) -> 3 rounds as the drivers' loop runs them (canary
client data and records; the process resets the server momentum itself where a correlated segment
starts) -> the privacy report of the plan and the observed log (`report.build_report`, as the drivers' `report_from_run_files`
builds it, without the equal-privacy table). SecAgg runs the process with TFF's secure intrinsics
replaced by their bodies (`tff.backends.test.replace_secure_intrinsics_with_bodies`, what TFF's test
context runs) in the default context: switching a process's context after computations ran can
hang (dp_ftrl_tff/training/secure_context.py); the drivers' own switch is tests/experiments/
secure_driver_test.py's. The report knows that the run trained its 3 rounds (`trained_rounds`), as
the drivers' does, so a Poisson run whose last round draws nobody is reported whole.
"""

import dataclasses
import itertools
import math
import os
from typing import Tuple

import numpy as np

from dp_ftrl_tff.mechanisms import registry

ROUNDS = 3

#: The factors and their values ('periodic' restarts: --restart_warmup with --restart_period).
FACTORS = {
    'mechanism': registry.names(streaming_only=True),
    'sampler': ('min_sep', 'poisson', 'cyclic_poisson'),
    'clipping': ('fixed', 'adaptive'),
    'restarts': ('none', 'rounds', 'periodic'),
    'secagg': (False, True),
    'canaries': (False, True),
}
#: The restart rounds each `restarts` value gives over ROUNDS rounds.
RESTART_ROUNDS = {'none': (), 'rounds': (2,), 'periodic': (1,)}


def allowed(values: dict) -> bool:
  """The drivers refuse SecAgg with random cohorts and with canaries (`RunConfig`)."""
  if values.get('secagg'):
    return values.get('sampler', 'min_sep') == 'min_sep' and not values.get('canaries', False)
  return True


#: Each driver's tiny run (`runs.tiny_config`'s settings) as flags, and its task's flags.
TINY_FLAGS = ('--rounds=3', '--client_batch_size=8', '--synthetic_num_clients=30',
              '--synthetic_examples_per_client=8', '--noise_seed=3', '--eval_every=3',
              '--eval_max_examples=16')
TASK_FLAGS = {'emnist': ('--model=tiny',),
              'stackoverflow': ('--vocab_size=50', '--embedding_size=8', '--lstm_size=8',
                                '--sequence_length=6', '--max_elements_per_client=8')}
#: A BSR strategy file optimized for another setting (10 rounds), for `--mechanism_file`.
BSR_FILE = '{bsr_file}'


@dataclasses.dataclass(frozen=True)
class Combination:
  """One value of each factor; the driver whose flags build it, more flags of that driver that no
  other run gives (docs/TESTING.md's flag table), and the run's seed."""
  mechanism: str
  sampler: str = 'min_sep'
  clipping: str = 'fixed'
  restarts: str = 'none'
  secagg: bool = False
  canaries: bool = False
  driver: str = 'emnist'
  flags: Tuple[str, ...] = ()
  seed: int = 1

  @property
  def id(self) -> str:
    return '-'.join([self.driver, self.mechanism, self.sampler, self.clipping,
                     f'restarts_{self.restarts}'] + ['secagg'] * self.secagg
                    + ['canaries'] * self.canaries)

  def values(self) -> dict:
    return {name: getattr(self, name) for name in FACTORS}

  def argv(self) -> list:
    """The flags of this combination (after the driver's tiny run's, `TINY_FLAGS`)."""
    argv = [f'--mechanism={self.mechanism}', f'--seed={self.seed}', *self.flags]
    if not any(f.startswith('--target_epsilon') for f in self.flags):
      # A noise multiplier of 5 keeps epsilon small: the accountant's PLD of a large epsilon
      # takes seconds (the tiny runs' 0.5 gives epsilon ~ 20).
      argv.append('--noise_multiplier=5')
    if self.sampler == 'min_sep':
      argv += ['--clients_per_round=3', '--min_sep=2']
    elif self.sampler == 'poisson':
      argv += ['--sampler=poisson', '--sampling_prob=0.2']
    else:
      argv += ['--sampler=cyclic_poisson', '--sampling_prob=0.3', '--sampling_groups=2']
    if self.clipping == 'adaptive':
      argv += ['--adaptive_clipping', '--clipped_count_stddev=5']
    if self.restarts == 'rounds':
      argv.append('--restart_rounds=2')
    elif self.restarts == 'periodic':
      argv += ['--restart_warmup=1', '--restart_period=2']
    if self.secagg:
      argv.append('--secure_aggregation')
    if self.canaries:
      argv.append('--canary_clients=2')
    return argv


def _rows(mechanisms, **values):
  return [Combination(m, **values) for m in mechanisms]


#: The combinations other tests run through the DP-FTRL process (a driver, or for mechanism x clipping x restarts the aggregation process, where they meet).
EXISTING = {
    'tests/experiments/drivers_test.py::test_emnist_run': _rows(['blt']),
    'tests/experiments/drivers_test.py::test_restarts_and_canaries':
        _rows(['blt'], clipping='adaptive', restarts='rounds'),
    'tests/experiments/drivers_test.py::test_resume_gives_the_same_weights':
        _rows(['blt'], restarts='periodic'),
    'tests/experiments/drivers_test.py::test_secure_aggregation_with_adaptive_clipping_and_a_restart':
        _rows(['blt'], secagg=True),
    'tests/experiments/secure_driver_test.py::test_modular_wraps_are_logged_and_written':
        _rows(['gaussian'], secagg=True),
    'tests/experiments/secure_driver_test.py::'
    'test_adaptive_clipping_with_beta_scale_follows_the_clip':
        _rows(['blt'], clipping='adaptive', restarts='periodic', secagg=True),
    'tests/experiments/canaries_driver_test.py::test_every_mechanism_reports_empirical_privacy':
        _rows(['gaussian', 'tree', 'banded', 'blt'], canaries=True),
    'tests/experiments/poisson_driver_test.py::'
    'test_poisson_run_logs_the_seeded_cohorts_and_runs_empty_rounds_to_its_report':
        _rows(['blt'], sampler='poisson'),
    'tests/experiments/poisson_driver_test.py::'
    'test_cyclic_poisson_binary_runs_and_a_bad_combination_is_one_line':
        _rows(['banded'], sampler='cyclic_poisson'),
    'tests/experiments/poisson_driver_test.py::test_poisson_run_resumes_with_the_same_cohorts':
        _rows(['gaussian'], sampler='poisson'),
    'tests/experiments/workers_test.py::'
    'test_driver_on_workers_equals_local_and_survives_lost_workers':
        _rows(['blt'], clipping='adaptive'),
    # Every (mechanism, restart flag) pair, the clipping alternating (its `_cases`): the flags
    # --restart_rounds, --restart_period and --restart_warmup with --restart_period.
    'tests/aggregators/restarts_test.py::test_noise_and_clip_restart_where_the_plan_says': [
        Combination(m, clipping='adaptive' if (i + j) % 2 == 0 else 'fixed', restarts=r)
        for i, m in enumerate(('tree', 'tree_efficient', 'banded', 'blt', 'bsr', 'bisr',
                               'gaussian'))
        for j, r in enumerate(('rounds', 'periodic', 'periodic'))],
}

#: The combinations for the pairs nothing else runs, each through one driver's flags (EMNIST's
#: tiny model; StackOverflow's LSTM takes about 3 times as long: it runs one SecAgg combination, over
#: its many weight tensors). SecAgg without rotation but there (hd): the DFT's chain takes seconds
#: to build, and the drivers' SecAgg runs use it (EXISTING).
SO = 'stackoverflow'
COMBINATIONS = [
    # Poisson sampling with each mechanism but blt and gaussian (EXISTING's).
    Combination('tree', 'poisson', 'fixed', 'rounds', seed=2),
    Combination('tree_efficient', 'poisson', 'adaptive', 'periodic', canaries=True,
                flags=('--target_unclipped_quantile=0.7', '--clip_learning_rate=0.1')),
    Combination('banded', 'poisson', 'fixed', 'none',
                flags=('--num_bands=1', '--error=rms')),
    Combination('bsr', 'poisson', 'adaptive', 'none', flags=('--num_bands=1',)),
    Combination('bisr', 'poisson', 'fixed', 'none', canaries=True,
                flags=('--num_bands=2',)),
    # Cyclic Poisson sampling with each mechanism but banded.
    Combination('gaussian', 'cyclic_poisson', 'adaptive', 'rounds',
                flags=('--target_unclipped_quantile=0.7', '--clip_learning_rate=0.1',
                       '--client_epochs=2')),
    Combination('tree', 'cyclic_poisson', 'fixed', 'periodic',
                flags=('--completion', '--model=fedavg_cnn')),
    Combination('tree_efficient', 'cyclic_poisson', 'fixed', 'none',
                flags=('--target_epsilon=3', '--target_delta=1e-6', '--completion')),
    Combination('blt', 'cyclic_poisson', 'adaptive', 'none', canaries=True,
                flags=('--theta=0.9,0.5', '--omega=0.3,0.2', '--target_delta=1e-6')),
    Combination('bsr', 'cyclic_poisson', 'fixed', 'rounds', canaries=True,
                flags=(f'--mechanism_file={BSR_FILE}', '--allow_strategy_setting_mismatch',
                       '--target_epsilon=3')),
    Combination('bisr', 'cyclic_poisson', 'adaptive', 'periodic',
                flags=('--server_momentum=0', '--client_learning_rate=0.05',
                       '--server_learning_rate=0.5', '--clip_norm=0.5')),
    # SecAgg with each mechanism but gaussian and blt.
    Combination('tree', clipping='adaptive', restarts='rounds', secagg=True,
                flags=('--secure_rotation=none', '--max_participations=2')),
    Combination('tree_efficient', restarts='periodic', secagg=True,
                flags=('--secure_rotation=none', '--secure_beta=0.1', '--secure_modclip_prob=1e-6',
                       '--secure_bits=18')),
    Combination('banded', clipping='adaptive', secagg=True,
                flags=('--secure_rotation=none', '--num_bands=2', '--toeplitz', '--error=max',
                       '--only_digits=false')),
    Combination('bsr', restarts='rounds', secagg=True, driver=SO,
                flags=('--secure_rotation=hd', '--secure_bits=18', '--secure_beta=0.1',
                       '--secure_modclip_prob=1e-6', '--num_bands=2', '--max_participations=2')),
    Combination('bisr', clipping='adaptive', restarts='periodic', secagg=True,
                flags=('--secure_rotation=none', '--num_bands=2')),
]


def uncovered_pairs(combinations) -> list:
  """The allowed (factor, value, factor, value) pairs that no combination of `combinations` runs."""
  covered = set()
  for combination in combinations:
    covered.update(itertools.combinations(sorted(combination.values().items()), 2))
  missing = []
  for (f1, v1s), (f2, v2s) in itertools.combinations(sorted(FACTORS.items()), 2):
    for v1, v2 in itertools.product(v1s, v2s):
      if allowed({f1: v1, f2: v2}) and ((f1, v1), (f2, v2)) not in covered:
        missing.append((f1, v1, f2, v2))
  return missing


def _replace_secure(computation):
  """`computation` with TFF's secure intrinsics replaced by their bodies, returning the Python
  containers of its type (the replaced computation returns plain structures)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  replaced = tff.backends.test.replace_secure_intrinsics_with_bodies(computation)
  result_type = computation.type_signature.result
  return lambda *args: tff.types.type_to_py_container(
      tff.structure.from_container(replaced(*args), recursive=True), result_type)


def config_from_flags(combination: Combination, root):
  """The `RunConfig` the combination's driver makes of its flags (`driver_flags.config_from_flags`,
  as `python -m <driver> ...` does), with the strategy file of `BSR_FILE` written under `root`."""
  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff.mechanisms import files, square_root
  from dp_ftrl_tff.mechanisms import participation as participation_lib
  from experiments.emnist import run_emnist
  from experiments.run import driver_flags
  from experiments.stackoverflow import run_stackoverflow
  # pylint: enable=g-import-not-at-top
  bsr_file = os.path.join(str(root), 'bsr.json')
  result = square_root.optimize_bsr(
      num_rounds=10, participation=participation_lib.ParticipationSchema.b_min_sep(2, None))
  files.save_strategy(result.strategy, bsr_file, result)
  module = run_emnist if combination.driver == 'emnist' else run_stackoverflow
  argv = ['driver', f'--root_output_dir={root}', *TINY_FLAGS, *TASK_FLAGS[combination.driver],
          *(a.replace(BSR_FILE, bsr_file) for a in combination.argv())]
  fv = module.FLAGS
  try:
    fv(argv)
    return driver_flags.config_from_flags(fv, module.task_settings(fv))
  finally:
    fv.unparse_flags()


def run_and_check(combination: Combination, root) -> None:
  """Runs `combination` under `root` the drivers' way (see the module docstring) and checks its
  rounds (segments, clips, SecAgg's wrap check, canary projections, finite losses and weights)
  and its privacy report (restart rounds, a finite guarantee, the empirical rows)."""
  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff import auditing, sampling
  from dp_ftrl_tff.accounting import participation_log, report
  from dp_ftrl_tff.learning import canaries as canaries_lib
  from dp_ftrl_tff.programs import metrics_release
  from dp_ftrl_tff.training import canary_clients, run_dir, run_start
  from experiments.emnist import run_emnist
  from experiments.stackoverflow import run_stackoverflow
  # pylint: enable=g-import-not-at-top

  config = config_from_flags(combination, root)
  module = run_emnist if combination.driver == 'emnist' else run_stackoverflow
  task = module.build_task(config)
  directory = run_dir.RunDirectory(config.output_dir)
  try:
    start = run_start.start_run(task, config, directory)
  finally:
    directory.release(remove_if_created=True)
  plan, process = start.plan, start.process
  restarts = RESTART_ROUNDS[combination.restarts]
  assert plan.planned_segments.restart_rounds == restarts
  initialize, next_fn = process.initialize, process.next
  if combination.secagg:
    initialize, next_fn = _replace_secure(initialize), _replace_secure(next_fn)
  state = initial = initialize()
  dataset_fn = lambda c: task.client_preprocess_fn(  # noqa: E731
      task.train_data.create_tf_dataset_for_client(c))
  recorder = None
  if combination.canaries:
    empty = dataset_fn(start.client_ids[0]).take(0)
    size = sum(int(np.size(w)) for w in process.get_model_weights(initial).trainable)
    recorder = canary_clients.CanaryRecorder(start.canaries, start.canary_ids,
                                             config.output_dir, size, plan, start.run_id)
    recorder.files.write_metadata()
  sampler = sampling.make_sampler(start.client_ids, plan, config.seed)
  ids, rounds, measured = [], [], []
  for t in range(ROUNDS):
    cohort = sampler.sample(t)
    ids += cohort
    rounds += [t] * len(cohort)
    if recorder is None:
      data = [dataset_fn(c) for c in cohort]
    else:  # a canary's input: an empty dataset and its index
      data = canaries_lib.client_data(
          [empty if c in recorder.index else dataset_fn(c) for c in cohort],
          [recorder.index.get(c, canaries_lib.NOT_A_CANARY) for c in cohort])
    output = next_fn(state, data)
    state, metrics = output.state, output.metrics
    aggregator = metrics['aggregator']
    measured.append(aggregator)
    if recorder is not None:
      assert np.shape(aggregator[canaries_lib.PROJECTIONS_MEASUREMENT]) == (4,)
      recorder.record_round(t, aggregator)
    row = metrics_release.round_metrics({'model_metrics': metrics['client_work']['train'],
                                         'aggregator': aggregator})
    if any(not c.startswith(canary_clients.CANARY_ID_PREFIX) for c in cohort):
      assert math.isfinite(row['train_loss']), (t, row)
  assert rounds, 'choose a seed whose rounds draw someone'

  # The segments restart on the plan's rounds, the clip changes only there, no SecAgg wrap.
  segments = [int(m['segment']) for m in measured]
  assert segments == [sum(t >= r for r in restarts) for t in range(ROUNDS)]
  clips = [float(m['clip']) for m in measured]
  assert all(clips[t] == clips[t - 1] for t in range(1, ROUNDS) if t not in restarts), clips
  if combination.secagg:
    assert [float(m['modular_wrap']) for m in measured] == [0.0] * ROUNDS
  if plan.strategy.correlated and restarts:  # the finalizer that resets the momentum counted them
    assert int(state.finalizer['round']) == ROUNDS
  assert np.all(np.isfinite(np.concatenate(
      [np.ravel(w) for w in process.get_model_weights(state).trainable])))

  # The report of the plan and the observed log, as the drivers build it.
  canaries = None
  if recorder is not None:
    recorder.record_final(process.get_model_weights(initial).trainable,
                          process.get_model_weights(state).trainable)
    canaries = auditing.read_canaries(recorder.files.path)
  secure_segments = None
  if combination.secagg:
    secure_segments = {'wrap_rounds': [], 'segments': [
        {'segment': s, 'clip': clips[t], 'sensitivity_clip': float(measured[t]['sensitivity_clip'])}
        for t, s in enumerate(segments) if t == 0 or segments[t - 1] != s]}
  built = report.build_report(
      plan, participation_log.ParticipationLog.from_arrays(ids, rounds),
      secure_segments=secure_segments, canaries=canaries, log_complete=True, trained_rounds=ROUNDS,
      final_clip=clips[-1] if combination.clipping == 'adaptive' else None)
  assert tuple(built.guarantee.restart_rounds) == restarts
  assert built.guarantee.rho > 0 and math.isfinite(built.guarantee.epsilon)
  if recorder is not None:
    assert built.empirical_privacy is not None
