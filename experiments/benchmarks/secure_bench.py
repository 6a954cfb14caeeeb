r"""Per-round wall time of the SecAgg chain: ours vs TFF's DistributedDpSumFactory.

All variants run in ONE process, in TFF's synchronous test execution context (set at start,
before any computation ran, with protobuf's nesting limit lifted as the drivers' loop does:
`dp_ftrl_tff.training.secure_context.allow_deep_computations`; the only contexts that run secure sums), on the same client values; their rounds are interleaved (the order rotates every
round) so that a change of machine load hits them alike. Per variant: one warm-up round, then
`--rounds` timed rounds; the table gives the median and the min-max of the timed rounds.

Variants (same clip, bits, rotation, beta, modclip_prob and noise multiplier):
  ours_secure  `CorrelatedNoiseFactory.gaussian(..., secure=SecureAggregation(...))`: clipping,
               the SecAgg chain with the modular wrap check, central Gaussian noise after the sum;
  tff_ddp      TFF's `distributed_dp.DistributedDpSumFactory(mechanism='distributed_dgauss')` (not
               exported in `tff.aggregators` in 0.87): clipping, the same chain without a wrap
               check, and local discrete Gaussian noise on the clients (the anchor);
  ours_plain   `CorrelatedNoiseFactory.gaussian(...)` without SecAgg (plain float sum);
  chain        the bare record chain, `secure.record_aggregation_factory` (concat -> rotation ->
               discretization -> wrap check -> modular clips -> secure sum), at the fixed scale of
               the clip;
  chain_nocheck, ours_nocheck  `chain` and `ours_secure` built with the wrap check replaced by a
               stub that passes the modular clips' output through and reports `modular_wrap` = 0
               (no second secure sum, no projections): the difference prices the check.

  TF_CPP_MIN_LOG_LEVEL=2 tools/in_session.sh \
      .venv/bin/python -m experiments.benchmarks.secure_bench \
      --dims=1000,100000,1000000 --clients=10 --rounds=9
"""

import statistics
from unittest import mock

from absl import flags

from experiments.benchmarks import harness

FLAGS = flags.FlagValues()

_DIMS = flags.DEFINE_list('dims', ['1000', '100000'], 'Parameters in the model update.',
                          flag_values=FLAGS)
_CLIENTS = flags.DEFINE_integer('clients', 10, 'Clients per round.', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 7, 'Timed rounds per variant (after one warm-up round).',
                               flag_values=FLAGS)
_VARIANTS = flags.DEFINE_list(
    'variants', ['ours_secure', 'tff_ddp', 'ours_plain', 'ours_nocheck', 'chain', 'chain_nocheck'],
    'Variants to measure.', flag_values=FLAGS)
_BITS = flags.DEFINE_integer('bits', 20, 'SecAgg field 2^bits.', flag_values=FLAGS)
_ROTATION = flags.DEFINE_enum('rotation', 'dft', ['dft', 'hd'], 'Flattening rotation.',
                              flag_values=FLAGS)
_BETA = flags.DEFINE_float('beta', 0.0, 'Conditional rounding bias.', flag_values=FLAGS)
_MODCLIP_PROB = flags.DEFINE_float('modclip_prob', 1e-4, 'Target modular wrap probability.',
                                   flag_values=FLAGS)
_NOISE = flags.DEFINE_float(
    'noise_multiplier', 0.0,
    'Noise multiplier of both factories (ours: central Gaussian; TFF: local discrete Gaussian).',
    flag_values=FLAGS)
_CLIP = flags.DEFINE_float('clip', 1.0, 'L2 clip norm.', flag_values=FLAGS)

PAIRS = (('ours_secure', 'tff_ddp'), ('ours_nocheck', 'tff_ddp'), ('ours_secure', 'ours_plain'),
         ('ours_secure', 'ours_nocheck'), ('chain', 'chain_nocheck'))


def _config():
  from dp_ftrl_tff.aggregators import SecureAggregation
  return SecureAggregation(bits=_BITS.value, rotation=_ROTATION.value, beta=_BETA.value,
                           modclip_prob=_MODCLIP_PROB.value)


def _make_factory(name, dim, clients):
  from tensorflow_federated.python.aggregators import distributed_dp

  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory, secure

  config, clip, noise = _config(), _CLIP.value, _NOISE.value
  if name == 'ours_secure':
    return CorrelatedNoiseFactory.gaussian(noise, clients, clip, noise_seed=1, secure=config)
  if name == 'ours_nocheck':
    with mock.patch.object(secure, 'ModularWrapCheckFactory', _NoWrapCheckFactory):
      return CorrelatedNoiseFactory.gaussian(noise, clients, clip, noise_seed=1, secure=config)
  if name == 'ours_plain':
    return CorrelatedNoiseFactory.gaussian(noise, clients, clip, noise_seed=1)
  if name == 'tff_ddp':
    return distributed_dp.DistributedDpSumFactory(
        noise_multiplier=noise, expected_clients_per_round=clients, bits=config.bits, l2_clip=clip,
        modclip_prob=config.modclip_prob, beta=config.beta, mechanism='distributed_dgauss',
        rotation_type=config.rotation, auto_l2_clip=False)
  scale = config.scale_factor(clip, clients, dim)
  if name == 'chain':
    return secure.record_aggregation_factory(config, scale, clip)
  if name == 'chain_nocheck':
    # `record_aggregation_factory` wraps the modular clips in `ModularWrapCheckFactory`; the stub
    # leaves the chain otherwise exactly as built there.
    with mock.patch.object(secure, 'ModularWrapCheckFactory', _NoWrapCheckFactory):
      return secure.record_aggregation_factory(config, scale, clip)
  raise ValueError(f'Unknown variant {name!r}.')


def _no_wrap_check_factory_class():
  import collections

  import tensorflow_federated as tff

  class NoWrapCheckFactory(tff.aggregators.UnweightedAggregationFactory):
    """`secure.ModularWrapCheckFactory` without the check: `modular_wrap` is always 0."""

    def __init__(self, inner_agg_factory, bits):
      del bits
      self._inner = inner_agg_factory

    def create(self, value_type):
      inner = self._inner.create(value_type)

      @tff.federated_computation
      def init_fn():
        return inner.initialize()

      @tff.federated_computation(init_fn.type_signature.result,
                                 tff.FederatedType(value_type, tff.CLIENTS))
      def next_fn(state, value):
        output = inner.next(state, value)
        measurements = collections.OrderedDict(
            modular_wrap=tff.federated_value(0, tff.SERVER), wrap_check=output.measurements)
        return tff.templates.MeasuredProcessOutput(
            state=output.state, result=output.result, measurements=tff.federated_zip(measurements))

      return tff.templates.AggregationProcess(init_fn, next_fn)

  return NoWrapCheckFactory


def _NoWrapCheckFactory(inner_agg_factory, bits):  # noqa: N802 (stands in for a class)
  return _no_wrap_check_factory_class()(inner_agg_factory, bits)


def _client_values(dim, clients):
  """Client updates with L2 norms from 0.5 to 2 clips (about half are clipped)."""
  import numpy as np
  rng = np.random.default_rng(0)
  norms = np.geomspace(0.5, 2.0, clients) * _CLIP.value
  values = []
  for norm in norms:
    direction = rng.normal(size=dim)
    values.append((norm * direction / np.linalg.norm(direction)).astype(np.float32))
  return values


def _find(structure, key):
  """First value under `key` in a nested measurement structure, else None."""
  if isinstance(structure, dict) or hasattr(structure, 'items'):
    for k, v in structure.items():
      if k == key:
        return v
      found = _find(v, key)
      if found is not None:
        return found
  return None


def _run_dim(dim, clients, variants, rounds):
  import numpy as np
  import tensorflow_federated as tff

  value_type = tff.TensorType(np.float32, [dim])
  values = _client_values(dim, clients)
  processes, states, builds, warmups, wraps, results = {}, {}, {}, {}, {}, {}
  for name in variants:
    build = harness.timed(lambda n=name: _make_factory(n, dim, clients).create(value_type))
    processes[name] = build.value
    initialized = harness.timed(processes[name].initialize)
    states[name], builds[name] = initialized.value, build.wall + initialized.wall
  times = {name: [] for name in variants}
  for r in range(rounds + 1):
    order = variants[r % len(variants):] + variants[:r % len(variants)]
    for name in order:
      timing = harness.timed(lambda n=name: processes[n].next(states[n], values))
      output, seconds = timing.value, timing.wall
      states[name] = output.state
      if r == 0:
        warmups[name] = seconds
        results[name] = np.asarray(output.result, np.float64)
      else:
        times[name].append(seconds)
      wrap = _find(output.measurements, 'modular_wrap')
      if wrap is not None and not name.endswith('nocheck'):
        wraps[name] = wraps.get(name, 0) + int(wrap)
  # Sanity: all variants release (about) the same sum; ours release the mean over `clients`.
  reference = np.sum([min(1.0, _CLIP.value / np.linalg.norm(v)) * v for v in values], axis=0)
  errors = {}
  for name, result in results.items():
    total = result * clients if name.startswith('ours') else result
    if name.startswith('chain'):
      reference_sum = np.sum(values, axis=0)
    else:
      reference_sum = reference
    errors[name] = float(np.linalg.norm(total - reference_sum) / np.linalg.norm(reference_sum))
  return times, builds, warmups, wraps, errors


def main(argv):
  del argv
  import tensorflow_federated as tff

  from dp_ftrl_tff.training import secure_context
  from experiments.cli import flag_parsing
  flag_parsing.end_workers_at_exit()
  secure_context.allow_deep_computations()
  tff.backends.test.set_sync_test_cpp_execution_context()

  variants = list(_VARIANTS.value)
  summary = {}
  for dim in (int(float(d)) for d in _DIMS.value):
    times, builds, warmups, wraps, errors = _run_dim(dim, _CLIENTS.value, variants, _ROUNDS.value)
    print(f'dim={dim} clients={_CLIENTS.value} timed rounds={_ROUNDS.value} bits={_BITS.value} '
          f'rotation={_ROTATION.value} beta={_BETA.value} noise_multiplier={_NOISE.value}',
          flush=True)
    print(f'{"variant":<15}{"median s":>10}{"min s":>9}{"max s":>9}{"warm-up s":>11}'
          f'{"build s":>9}{"wraps":>7}{"rel. err":>10}')
    for name in variants:
      t = times[name]
      summary[(dim, name)] = statistics.median(t)
      wrap = str(wraps[name]) if name in wraps else '-'
      print(f'{name:<15}{statistics.median(t):>10.4f}{min(t):>9.4f}{max(t):>9.4f}'
            f'{warmups[name]:>11.2f}{builds[name]:>9.2f}{wrap:>7}{errors[name]:>10.1e}')
    for a, b in PAIRS:
      if a in times and b in times:
        ratio = harness.ratio(summary[(dim, a)], summary[(dim, b)])
        # Per-round ratios of the interleaved rounds (same round index) show the spread.
        paired = sorted(harness.ratio(x, y) for x, y in zip(times[a], times[b], strict=True))
        print(f'  {a} / {b}: {ratio:.3f} (median ratio of paired rounds '
              f'{statistics.median(paired):.3f}, range {paired[0]:.3f}-{paired[-1]:.3f}); '
              f'difference {1e3 * (summary[(dim, a)] - summary[(dim, b)]):+.1f} ms')
    print(flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
