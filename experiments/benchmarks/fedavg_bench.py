r"""End-to-end FedAvg round time: this project's aggregators vs TFF's DifferentiallyPrivateFactory.

One `tff.learning.algorithms.build_unweighted_fed_avg` process per configuration, on the EMNIST CNN
the drivers train (`experiments.emnist.models`, `fedavg_cnn`: 1,663,370 parameters) and the
drivers' synthetic EMNIST population (`experiments.emnist.data.synthetic_client_data`, TFF's element
format, `--population` clients of about `--examples_per_client` examples), preprocessed as the
driver does (`preprocess_fn`: batches of `--batch_size`, one epoch). Client SGD (learning rate 0.1),
server SGD with momentum 0.9 (learning rate 1), as the driver's defaults. The only difference
between configurations is `model_aggregator` (noise multiplier 1, clip 1, `--clients` clients per
round, fixed noise seed):
  tff_gaussian   `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`     (anchor)
  tff_tree       `DifferentiallyPrivateFactory.tree_aggregation`, efficient         (anchor)
  ours_gaussian  `CorrelatedNoiseFactory.gaussian`
  ours_blt       `CorrelatedNoiseFactory.blt`, 2 buffers (the aggregator benchmark's BLT)
  ours_banded    `CorrelatedNoiseFactory.banded`, 3 bands (2 buffers) for 2048 rounds
  ours_tree      `CorrelatedNoiseFactory.tree`, efficient
Round r trains the clients r*C .. r*C + C - 1 (mod the population): every configuration sees the
same data in the same rounds.

Interleaving (`--interleave`, each way repeated `--repeats` times), as in `aggregator_bench`:
  * processes (default): each configuration runs in its own child process (fresh TFF worker, so
    peak memory is its own), one after the other in the order of `--configs`;
  * rounds: one child builds every configuration and runs the timed rounds round-robin (round r of
    each configuration in turn, one shared worker), so that all see the same load from other jobs.
Per configuration: `--warmup` rounds (the first compiles), then the child collects and freezes the
heap (as `aggregator_bench` does) and times `--rounds` rounds; the figures are the median wall
seconds of the timed rounds, the child's and its worker's user + system CPU seconds per timed round,
and (processes only) the peak memory (own peak RSS + the worker's VmHWM). The parent prints
medians over the repeats and every ratio ours / anchor, the issue-16 target pairs marked with `*`
(gaussian and BLT, and banded, vs `gaussian_fixed`; the tree vs `tree_aggregation`; target <= 1.05).

  tools/in_session.sh nice -n 10 .venv/bin/python -m experiments.benchmarks.fedavg_bench \
      --clients=50 --rounds=4 --repeats=2 --interleave=rounds
"""

import json
import sys

from absl import flags

from experiments.benchmarks import harness, tff_rounds

FLAGS = flags.FlagValues()
_CONFIG_NAMES = ('tff_gaussian', 'ours_gaussian', 'ours_blt', 'ours_banded', 'tff_tree', 'ours_tree')
_CONFIGS = flags.DEFINE_list(
    'configs', list(_CONFIG_NAMES),
    'Configurations to measure (tff_gaussian, tff_tree, ours_gaussian, ours_blt, ours_banded, '
    'ours_tree).', flag_values=FLAGS)
flags.register_validator(
    'configs', lambda names: bool(names) and set(names) <= set(_CONFIG_NAMES),
    f'must be a non-empty comma-separated subset of {", ".join(_CONFIG_NAMES)}', flag_values=FLAGS)
_CLIENTS = flags.DEFINE_integer('clients', 50, 'Clients per round C.', lower_bound=1, flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds per child (after the warm-up).',
                               lower_bound=1, flag_values=FLAGS)
_WARMUP = flags.DEFINE_integer('warmup', 1, 'Untimed warm-up rounds per child (>= 1).',
                               lower_bound=1, flag_values=FLAGS)
_REPEATS = harness.define_repeats(FLAGS, 2, 'Passes over --configs (interleaved children).')
_MODEL = flags.DEFINE_enum('model', 'fedavg_cnn', ['fedavg_cnn', 'tiny'],
                           'EMNIST model (`experiments.emnist.models`).', flag_values=FLAGS)
_POPULATION = flags.DEFINE_integer('population', 1000, 'Synthetic clients in the population.',
                                   lower_bound=1, flag_values=FLAGS)
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 20, 'Mean examples per synthetic client.',
                                 lower_bound=1, flag_values=FLAGS)
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 16, 'Client batch size (the driver default).',
                                   lower_bound=1, flag_values=FLAGS)
_INTERLEAVE = flags.DEFINE_enum(
    'interleave', 'processes', ['processes', 'rounds'],
    'processes: one child process per configuration and repeat (per-configuration peak memory); '
    'rounds: one child per repeat holding every configuration, timed rounds round-robin over them '
    '(all see the same load; no per-configuration peak memory).', flag_values=FLAGS)
_CHILD = flags.DEFINE_string('child', None, 'Internal: measure these configurations, print JSON.',
                             flag_values=FLAGS)

NOISE_MULTIPLIER = 1.0
CLIP = 1.0
CLIENT_LEARNING_RATE = 0.1
SERVER_LEARNING_RATE = 1.0
SERVER_MOMENTUM = 0.9


def _aggregator(name: str, clients: int, model_fn):
  import tensorflow_federated as tff

  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
  from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
  from dp_ftrl_tff.mechanisms import blt as blt_mechanisms

  if name == 'tff_gaussian':
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(NOISE_MULTIPLIER, clients,
                                                                       CLIP)
  if name == 'tff_tree':
    specs = tff.types.type_to_tf_tensor_specs(
        tff.learning.models.weights_type_from_model(model_fn).trainable)
    return tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
        NOISE_MULTIPLIER, clients, CLIP, record_specs=specs, noise_seed=1, use_efficient=True)
  if name == 'ours_gaussian':
    return CorrelatedNoiseFactory.gaussian(NOISE_MULTIPLIER, clients, CLIP, noise_seed=1)
  if name == 'ours_blt':
    strategy = blt_mechanisms.BLTStrategy(theta=(0.99, 0.8), omega=(0.25, 0.2))
    return CorrelatedNoiseFactory.blt(NOISE_MULTIPLIER, clients, CLIP, strategy=strategy,
                                      noise_seed=1)
  if name == 'ours_banded':
    strategy = banded_mechanisms.BandedStrategy.from_toeplitz(tff_rounds.BANDED_COEFS,
                                                              tff_rounds.BANDED_ROUNDS)
    return CorrelatedNoiseFactory.banded(NOISE_MULTIPLIER, clients, CLIP, strategy=strategy,
                                         noise_seed=1)
  if name == 'ours_tree':
    return CorrelatedNoiseFactory.tree(NOISE_MULTIPLIER, clients, CLIP, use_efficient=True,
                                       noise_seed=1)
  raise ValueError(f'Unknown configuration {name!r}.')


def _measure(names: list) -> list:
  """Times the configurations `names` in this process (round-robin over them when several)."""
  from experiments.cli import flag_parsing
  from experiments.emnist import data as emnist_data
  from experiments.emnist import models as emnist_models
  flag_parsing.end_workers_at_exit()

  clients, warmup, rounds = _CLIENTS.value, max(1, _WARMUP.value), _ROUNDS.value
  train, _ = emnist_data.synthetic_client_data(_POPULATION.value,
                                               examples_per_client=_EXAMPLES.value, seed=0)
  preprocess = emnist_data.preprocess_fn(_BATCH_SIZE.value, 1, shuffle_seed=0)
  ids = train.client_ids
  round_data = [
      [preprocess(train.create_tf_dataset_for_client(ids[(r * clients + i) % len(ids)]))
       for i in range(clients)]
      for r in range(warmup + rounds)]
  model_fn = emnist_models.tff_model_fn(_MODEL.value, 10, 0)

  runs = []
  for name in names:
    build = harness.timed(lambda n=name: _fed_avg(model_fn, _aggregator(n, clients, model_fn)))
    process, state = build.value
    warmup_times = []
    for r in range(warmup):
      timing = harness.timed(lambda p=process, s=state, r=r: p.next(s, round_data[r]).state)
      state = timing.value
      warmup_times.append(timing.wall)
    runs.append({'name': name, 'process': process, 'state': state,
                 'build_seconds': build.wall, 'warmup_seconds': warmup_times})
  return tff_rounds.time_rounds(runs, rounds, lambda r: round_data[warmup + r])


def _fed_avg(model_fn, aggregator):
  """TFF's unweighted FedAvg process with `aggregator` and its initial state."""
  import tensorflow_federated as tff
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(CLIENT_LEARNING_RATE),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(SERVER_LEARNING_RATE,
                                                             momentum=SERVER_MOMENTUM),
      model_aggregator=aggregator)
  return process, process.initialize()


def _child_command(names: list) -> list:
  return [sys.executable, '-m', 'experiments.benchmarks.fedavg_bench', f'--child={",".join(names)}',
          f'--clients={_CLIENTS.value}', f'--rounds={_ROUNDS.value}', f'--warmup={_WARMUP.value}',
          f'--model={_MODEL.value}', f'--population={_POPULATION.value}',
          f'--examples_per_client={_EXAMPLES.value}', f'--batch_size={_BATCH_SIZE.value}']


def main(argv):
  del argv
  if _CHILD.value:
    print('RESULT ' + json.dumps(_measure(_CHILD.value.split(','))), flush=True)
    return
  results = tff_rounds.run_children(_child_command, _CONFIGS.value, _REPEATS.value,
                                    _INTERLEAVE.value)
  print(f'model={_MODEL.value} clients={_CLIENTS.value} timed rounds={_ROUNDS.value} '
        f'warmup={_WARMUP.value} repeats={_REPEATS.value} interleave={_INTERLEAVE.value} '
        f'{harness.conditions()}')
  tff_rounds.print_summary(results)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
