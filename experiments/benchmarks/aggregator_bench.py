r"""Per-round wall time, CPU time and peak memory: our factories vs TFF's DP factory.

The parent prints every ratio ours / anchor, the issue-16 target pairs marked with `*` (target
<= 1.05): gaussian, BLT (2 buffers) and banded (BandMF, 3 bands = 2 buffers) vs
`DifferentiallyPrivateFactory.gaussian_fixed`, the efficient tree vs `.tree_aggregation`
(efficient). Two ways to interleave (`--interleave`), each repeated `--repeats` times:
  * processes (default): each factory runs in its own child process (fresh TFF worker, so peak
    memory is its own), the children one after the other in the order of `--factories`;
  * rounds: one child builds every factory and runs their timed rounds round-robin (one round of
    each in turn, in a new random order each round, one shared worker), so that all factories see
    the same load from other jobs on a shared machine; no per-factory peak memory.
Per child and factory: one warm-up round, then the child collects garbage and freezes the heap
(`gc.freeze`, so that a full collection of the TF / TFF heap, 0.2-0.3 s triggered by allocation
counts, does not land in one factory's timed rounds only), then `--rounds` timed rounds. Wall time
is the median over the timed rounds; CPU time is the child's plus its TFF `worker_binary`'s user +
system CPU seconds per timed round (less sensitive than wall time to other jobs); peak memory is
the high-water resident set (VmHWM) of the worker plus the child's own peak RSS (client data lives
in both). Across repeats the parent takes medians. The header records the load average and any
glibc `MALLOC_*` tuning variable in the environment (the children and their workers inherit them;
docs/benchmarks/aggregators.md, "glibc malloc settings", measures their effect).

  tools/in_session.sh .venv/bin/python -m experiments.benchmarks.aggregator_bench \
      --dim=4000000 --clients=100 --rounds=3
  tools/in_session.sh nice -n 10 .venv/bin/python -m experiments.benchmarks.aggregator_bench \
      --dim=100000 --clients=10 --rounds=40 --repeats=3 --interleave=rounds
"""

import json
import sys

from absl import flags

from experiments.benchmarks import harness, tff_rounds

FLAGS = flags.FlagValues()
_DIM = flags.DEFINE_integer('dim', 4_000_000, 'Parameters in the model update.', lower_bound=1, flag_values=FLAGS)
_CLIENTS = flags.DEFINE_integer('clients', 100, 'Clients per round.', lower_bound=1, flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds (after one warm-up round).',
                               lower_bound=1, flag_values=FLAGS)
_REPEATS = harness.define_repeats(FLAGS, 1, 'Passes over --factories (see --interleave).')
FACTORY_NAMES = ('tff_gaussian', 'ours_gaussian', 'tff_tree', 'ours_tree', 'ours_blt', 'ours_banded')
_FACTORIES = flags.DEFINE_list(
    'factories', list(FACTORY_NAMES),
    'Factories to measure (tff_gaussian, tff_tree, ours_gaussian, ours_tree, ours_blt, '
    'ours_banded).', flag_values=FLAGS)
flags.register_validator(
    'factories', lambda names: bool(names) and set(names) <= set(FACTORY_NAMES),
    f'must be a non-empty comma-separated subset of {", ".join(FACTORY_NAMES)}', flag_values=FLAGS)
_INTERLEAVE = flags.DEFINE_enum(
    'interleave', 'processes', ['processes', 'rounds'],
    'processes: one child process per factory and repeat (per-factory peak memory); rounds: one '
    'child per repeat holding every factory, timed rounds round-robin over them (all see the same '
    'load; no per-factory peak memory).', flag_values=FLAGS)
_CHILD = flags.DEFINE_string('child', None, 'Internal: measure these factories, print JSON.',
                             flag_values=FLAGS)

NOISE_MULTIPLIER = 1.0
CLIP = 1.0


def _make_factory(name, dim, clients):
  import tensorflow as tf
  import tensorflow_federated as tff

  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
  from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
  from dp_ftrl_tff.mechanisms import blt as blt_mechanisms

  if name == 'tff_gaussian':
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(NOISE_MULTIPLIER, clients,
                                                                       CLIP)
  if name == 'tff_tree':
    return tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
        NOISE_MULTIPLIER, clients, CLIP, record_specs=tf.TensorSpec([dim], tf.float32),
        noise_seed=1, use_efficient=True)
  if name == 'ours_gaussian':
    return CorrelatedNoiseFactory.gaussian(NOISE_MULTIPLIER, clients, CLIP, noise_seed=1)
  if name == 'ours_tree':
    return CorrelatedNoiseFactory.tree(NOISE_MULTIPLIER, clients, CLIP, use_efficient=True,
                                       noise_seed=1)
  if name == 'ours_blt':
    # A 2-buffer BLT of the size the BLT paper uses for ~2000 rounds (App. A scale).
    strategy = blt_mechanisms.BLTStrategy(theta=(0.99, 0.8), omega=(0.25, 0.2))
    return CorrelatedNoiseFactory.blt(NOISE_MULTIPLIER, clients, CLIP, strategy=strategy,
                                      noise_seed=1)
  if name == 'ours_banded':
    strategy = banded_mechanisms.BandedStrategy.from_toeplitz(tff_rounds.BANDED_COEFS,
                                                              tff_rounds.BANDED_ROUNDS)
    return CorrelatedNoiseFactory.banded(NOISE_MULTIPLIER, clients, CLIP, strategy=strategy,
                                         noise_seed=1)
  raise ValueError(f'Unknown factory {name!r}.')


def _measure(names, dim, clients, rounds) -> list:
  """Times `names` in this process: each factory's process runs one warm-up round, then the timed
  rounds go round-robin over the factories (one round each in turn), so that all of them see the
  same load. Per factory: median wall seconds, and CPU seconds per round (this process + its worker,
  read around each call). Peak memory is per factory only when `names` has one entry."""
  import numpy as np
  import tensorflow_federated as tff

  from experiments.cli import flag_parsing
  flag_parsing.end_workers_at_exit()
  rng = np.random.default_rng(0)
  values = [rng.normal(scale=0.01, size=dim).astype(np.float32) for _ in range(clients)]
  runs = []
  for name in names:
    build = harness.timed(
        lambda n=name: _make_factory(n, dim, clients).create(tff.TensorType(np.float32, [dim])))
    process = build.value
    warmup = harness.timed(lambda p=process: p.next(p.initialize(), values).state)
    runs.append({'name': name, 'process': process, 'state': warmup.value,
                 'build_seconds': build.wall, 'warmup_seconds': warmup.wall})
  return tff_rounds.time_rounds(runs, rounds, lambda r: values)


def _child_command(names: list) -> list:
  return [sys.executable, '-m', 'experiments.benchmarks.aggregator_bench',
          f'--child={",".join(names)}', f'--dim={_DIM.value}', f'--clients={_CLIENTS.value}',
          f'--rounds={_ROUNDS.value}']


def main(argv):
  del argv
  if _CHILD.value:
    print('RESULT ' + json.dumps(_measure(_CHILD.value.split(','), _DIM.value, _CLIENTS.value,
                                          _ROUNDS.value)), flush=True)
    return
  results = tff_rounds.run_children(_child_command, _FACTORIES.value, _REPEATS.value,
                                    _INTERLEAVE.value)
  print(f'dim={_DIM.value} clients={_CLIENTS.value} timed rounds={_ROUNDS.value} '
        f'repeats={_REPEATS.value} interleave={_INTERLEAVE.value} {harness.conditions()}')
  tff_rounds.print_summary(results)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
