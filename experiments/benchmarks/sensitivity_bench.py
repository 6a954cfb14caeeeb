"""Times the core mechanism helpers: Alg. 4 bound, Alg. 5, Thm. 3.1 and the Toeplitz inverse.

  .venv/bin/python -m experiments.benchmarks.sensitivity_bench [--num_rounds=2052 --min_sep=342 ...]

Cases (n = num_rounds, b = min_sep, k = max_participations):
  * `min_sep_upper_bound_squared` (BandMF Alg. 4, O(n^2 k)) on a dense lower-triangular C;
  * `banded_squared` (Alg. 5) on a b-banded C, including the structural orthogonality check;
  * `dense_squared` on the dense C (dispatch + Alg. 4);
  * `toeplitz_squared` (BLT Thm. 3.1, O(kn)) and `inverse_coefs` (O(n log n)) at n and at
    `--large_rounds` for the App. A b=400 BLT.
Reports the best of `--repeats` wall-clock timings.
"""

import numpy as np
from absl import flags

from dp_ftrl_tff.mechanisms import blt, sensitivity, toeplitz
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_NUM_ROUNDS = flags.DEFINE_integer('num_rounds', 2052, 'n.', flag_values=FLAGS)
_MIN_SEP = flags.DEFINE_integer('min_sep', 342, 'b (TF-Privacy min_separation + 1).', flag_values=FLAGS)
_MAX_PARTICIPATIONS = flags.DEFINE_integer('max_participations', 6, 'k.', flag_values=FLAGS)
_LARGE_ROUNDS = flags.DEFINE_integer('large_rounds', 200_000, 'n for the Toeplitz-only cases.', flag_values=FLAGS)
_REPEATS = harness.define_repeats(FLAGS, 3, 'Timed repetitions (the best is reported).')


def main(argv):
  del argv
  n, b, k = _NUM_ROUNDS.value, _MIN_SEP.value, _MAX_PARTICIPATIONS.value
  schema = ParticipationSchema.b_min_sep(b, k)
  rng = np.random.default_rng(0)
  dense = np.tril(rng.uniform(size=(n, n)))
  banded = dense * (np.subtract.outer(np.arange(n), np.arange(n)) < b)
  print(f'n={n} min_sep={b} max_participations={k} (best of {_REPEATS.value})')
  cases = [
      ('min_sep_upper_bound_squared (Alg. 4), dense C',
       lambda: sensitivity.min_sep_upper_bound_squared(dense, schema)),
      ('dense_squared, dense C', lambda: sensitivity.dense_squared(dense, schema)),
      ('banded_squared (Alg. 5), b-banded C', lambda: sensitivity.banded_squared(banded, schema)),
  ]
  for large in (n, _LARGE_ROUNDS.value):
    coefs = blt.PRODUCTION_STRATEGIES[400].toeplitz_coefs(large)
    cases.append((f'toeplitz_squared (Thm. 3.1), n={large}',
                  lambda c=coefs, m=large: sensitivity.toeplitz_squared(c, m, schema)))
    cases.append((f'inverse_coefs, n={large}',
                  lambda c=coefs, m=large: float(toeplitz.inverse_coefs(c, m)[-1])))
  for label, fn in cases:
    best = harness.best_of(fn, _REPEATS.value)
    print(f'{label:<50} {best.wall:9.4f} s   value {best.value:.6g}')


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
