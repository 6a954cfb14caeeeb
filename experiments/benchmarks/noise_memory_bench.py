r"""Noise-state memory per model parameter, per mechanism, measured against the theory.

For each mechanism this builds `CorrelatedNoiseFactory` for a model update of `--params` float32
parameters (one tensor), runs its `initialize` and `--rounds` rounds of `next` (one client; TFF's
local execution context) and measures the bytes of the real state: the model noise state
(`state.noise_state`) and the whole aggregator state, after `initialize` and after every round
(the sum of the state's array sizes, `numpy.ndarray.nbytes`; strings count their length). Each
figure is divided by 4 * P bytes, one float32 copy of the model update, and printed next to the
theory, in model-sized vectors after r rounds (0-based rounds 0 .. r - 1 done):
  * gaussian (C = I) and the vanilla tree: 0 (the vanilla tree redraws replaced siblings from the
    seed);
  * efficient tree (Honaker): popcount(r), the live left siblings (the top height of a tree of
    `max_rounds_per_tree` rounds is never stored); max over r <= n: floor(log2(n + 1)), about
    log2 n, and mean about log2(n) / 2;
  * BandMF (banded C, b-hat bands) and BSR: b-hat - 1 (ring buffer of the last outputs);
  * BISR (banded C^-1): b-hat - 1 (ring buffer of the last scaled draws);
  * BLT with d buffers: d.
The scalars (int64[2] seed, round and row counters) add a constant few dozen bytes. As an anchor the
same is printed for TFF's `DifferentiallyPrivateFactory.tree_aggregation` (efficient; its DP query
state, no theory column: TF-Privacy's tree keeps its live levels too, plus one or two more vectors).

  tools/in_session.sh nice -n 10 .venv/bin/python -m experiments.benchmarks.noise_memory_bench \
      --params=100000 --rounds=128
"""

import math
import statistics

from absl import flags

from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_PARAMS = flags.DEFINE_integer('params', 100_000, 'P: float32 parameters of the model update.',
                               lower_bound=1, flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 128, 'n: rounds run (the tree stays within one tree).',
                               lower_bound=1, flag_values=FLAGS)
_NUM_BANDS = flags.DEFINE_integer('num_bands', 4, 'b-hat of the banded, BSR and BISR strategies.',
                                  lower_bound=1, flag_values=FLAGS)
_NUM_BUFFERS = flags.DEFINE_integer('num_buffers', 4, 'd: buffers of the BLT.', lower_bound=1,
                                    flag_values=FLAGS)
_MECHANISM_NAMES = ('gaussian', 'tree_vanilla', 'tree_efficient', 'banded', 'bsr', 'bisr', 'blt',
                    'tff_tree')
_MECHANISMS = flags.DEFINE_list(
    'mechanisms', list(_MECHANISM_NAMES),
    'Mechanisms to measure (tff_tree: TFF\'s tree_aggregation, the anchor).', flag_values=FLAGS)
flags.register_validator(
    'mechanisms', lambda names: bool(names) and set(names) <= set(_MECHANISM_NAMES),
    f'must be a non-empty comma-separated subset of {", ".join(_MECHANISM_NAMES)}', flag_values=FLAGS)

NOISE_MULTIPLIER = 1.0
CLIP = 1.0


def theory_vectors(mechanism: str, rounds_done: int, num_bands: int, num_buffers: int):
  """Model-sized vectors the noise state holds after `rounds_done` rounds (None: no theory)."""
  if mechanism in ('gaussian', 'tree_vanilla'):
    return 0
  if mechanism == 'tree_efficient':
    return bin(rounds_done).count('1')
  if mechanism in ('banded', 'bsr', 'bisr'):
    return num_bands - 1
  if mechanism == 'blt':
    return num_buffers
  return None


def _factory(mechanism: str, params: int, rounds: int, num_bands: int, num_buffers: int):
  import numpy as np
  import tensorflow as tf
  import tensorflow_federated as tff

  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
  from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
  from dp_ftrl_tff.mechanisms import square_root

  args = (NOISE_MULTIPLIER, 1, CLIP)
  if mechanism == 'gaussian':
    return CorrelatedNoiseFactory.gaussian(*args, noise_seed=1)
  if mechanism in ('tree_vanilla', 'tree_efficient'):
    return CorrelatedNoiseFactory.tree(*args, use_efficient=mechanism == 'tree_efficient',
                                       noise_seed=1)
  if mechanism == 'banded':
    coefs = square_root.BandedSquareRootStrategy(num_bands).toeplitz_coefs(num_bands)
    strategy = banded_mechanisms.BandedStrategy.from_toeplitz(coefs, rounds)
    return CorrelatedNoiseFactory.banded(*args, strategy=strategy, noise_seed=1)
  if mechanism == 'bsr':
    return CorrelatedNoiseFactory.bsr(*args, num_bands=num_bands, noise_seed=1)
  if mechanism == 'bisr':
    return CorrelatedNoiseFactory.bisr(*args, num_bands=num_bands, noise_seed=1)
  if mechanism == 'blt':
    theta = np.linspace(0.99, 0.5, num_buffers)
    omega = np.full(num_buffers, 0.5 / num_buffers)
    return CorrelatedNoiseFactory.blt(*args, theta=theta, omega=omega, noise_seed=1)
  if mechanism == 'tff_tree':
    return tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
        NOISE_MULTIPLIER, 1, CLIP, record_specs=tf.TensorSpec([params], tf.float32), noise_seed=1,
        use_efficient=True)
  raise ValueError(f'Unknown mechanism {mechanism!r}.')


def state_bytes(structure) -> int:
  """Bytes of the arrays in a (nested) state: numpy nbytes, strings their length."""
  import numpy as np
  import tensorflow as tf

  total = 0
  for leaf in tf.nest.flatten(structure):
    if isinstance(leaf, (bytes, str)):
      total += len(leaf)
      continue
    array = np.asarray(leaf)
    total += (sum(len(x) for x in array.ravel()) if array.dtype.kind in 'OSU' else array.nbytes)
  return total


def measure(mechanism: str, params: int, rounds: int, num_bands: int, num_buffers: int) -> dict:
  """Noise-state and whole-state bytes after init and after each of `rounds` rounds."""
  import numpy as np
  import tensorflow_federated as tff

  process = _factory(mechanism, params, rounds, num_bands, num_buffers).create(
      tff.TensorType(np.float32, [params]))
  value = [np.random.default_rng(0).normal(scale=0.01, size=params).astype(np.float32)]

  def noise_part(state):
    return state.query_state if mechanism == 'tff_tree' else state.noise_state

  state = process.initialize()
  noise, whole = [state_bytes(noise_part(state))], [state_bytes(state)]

  def run_rounds(state):
    for _ in range(rounds):
      state = process.next(state, value).state
      noise.append(state_bytes(noise_part(state)))
      whole.append(state_bytes(state))

  timing = harness.timed(lambda: run_rounds(state))
  return {'noise_bytes': noise, 'state_bytes': whole, 'round_seconds': timing.wall / rounds}


def main(argv):
  del argv
  from experiments.cli import flag_parsing
  flag_parsing.end_workers_at_exit()
  params, rounds = _PARAMS.value, _ROUNDS.value
  bands, buffers = _NUM_BANDS.value, _NUM_BUFFERS.value
  vector = 4.0 * params
  print(f'P={params} float32 parameters (one vector = {vector / 2**20:.3f} MiB), n={rounds} '
        f'rounds, b-hat={bands}, d={buffers}; figures in model-sized vectors (bytes / 4P)')
  header = (f'{"mechanism":<16}{"init":>8}{"max":>8}{"mean":>8}{"final":>8}{"whole max":>11}'
            f'  | theory: {"init":>6}{"max":>6}{"mean":>7}{"final":>6}')
  print(header)
  for mechanism in _MECHANISMS.value:
    result = measure(mechanism, params, rounds, bands, buffers)
    noise = [b / vector for b in result['noise_bytes']]
    whole = max(result['state_bytes']) / vector
    line = (f'{mechanism:<16}{noise[0]:>8.4f}{max(noise):>8.4f}{statistics.mean(noise[1:]):>8.4f}'
            f'{noise[-1]:>8.4f}{whole:>11.4f}  | ')
    theory = [theory_vectors(mechanism, r, bands, buffers) for r in range(rounds + 1)]
    if theory[0] is None:
      line += f'{"-":>14}  (TF-Privacy: about log2 n = {math.log2(rounds):.1f} at most)'
    else:
      line += (f'{theory[0]:>14d}{max(theory):>6d}{statistics.mean(theory[1:]):>7.3f}'
               f'{theory[-1]:>6d}')
    print(line, flush=True)
  print('max: over the states after init and rounds 1 .. n; mean: after rounds 1 .. n; '
        '"whole max": the whole aggregator state (noise state, clip, counters, accounting JSON; '
        'TFF: its whole DP state).')


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
