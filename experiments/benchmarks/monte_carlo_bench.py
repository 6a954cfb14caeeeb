r"""Monte Carlo accounting benchmark: `accounting.monte_carlo_epsilon` at n = 2000 rounds.

  python -m experiments.benchmarks.monte_carlo_bench [--rounds=2000 --num_samples=10000,100000 \
      --bands=20 --noise_multiplier=1 --sampling_prob=0.01 --target_delta=1e-3]

Cases (wall time of one call, which draws `num_samples` losses per direction):
  1. C = identity, Poisson sampling (cyclic_poisson with period 1: the 'per_round' method);
  2. C = identity, min_sep 1 (the same mechanism through the 'markov' recursion: the intervals of 1
     and 2 must overlap);
  3. C = identity, balls-in-bins with epochs of `bands` rounds ('per_epoch');
  4. C = banded Toeplitz with `bands` bands (coefficients of A^(1/2), `banded.fhu_coefficients`),
     cyclic Poisson with period `bands` and probability min(1, bands * sampling_prob) (the BandMF
     paper's amplification setting: same expected batch; 'per_round');
  5. the same C under min_sep = `bands` with that probability ('markov', sparse C^T y).
Anchor, measured in the same run: dp_accounting's PLD accountant (value discretization 1e-4) on the
closed-form event of cases 1 and 4 (SelfComposed PoissonSampled Gaussian; for 4 the BandMF Thm. 4
event with the largest column norm, ceil(n / bands) compositions). The ratio is Monte Carlo time over
PLD time (wall); CPU time is printed too, as the machine is shared. The PLD epsilon should lie in
the Monte Carlo interval (case 4: up to the slack of the largest-norm event). Results go to
docs/BENCHMARKS.md by hand (figures depend on machine load).
"""

import math

import dp_accounting
import numpy as np
from absl import flags

from dp_ftrl_tff.accounting import monte_carlo
from dp_ftrl_tff.mechanisms import banded
from experiments.benchmarks import harness
from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_ROUNDS = flags.DEFINE_integer('rounds', 2000, 'Rounds n.', lower_bound=1, flag_values=FLAGS)
_NUM_SAMPLES = flags.DEFINE_list('num_samples', ['10000', '100000'],
                                 'Samples per direction, one run each.', flag_values=FLAGS)
_BANDS = flags.DEFINE_integer('bands', 20, 'Bands of the banded C, its cyclic period and min_sep, '
                              'and the balls-in-bins epoch length.', lower_bound=1,
                              flag_values=FLAGS)
_SIGMA = flags.DEFINE_float('noise_multiplier', 1.0, 'Noise multiplier sigma.', flag_values=FLAGS)
_Q = flags.DEFINE_float('sampling_prob', 0.01, 'Poisson sampling probability of the identity cases.',
                        flag_values=FLAGS)
_DELTA = flags.DEFINE_float('target_delta', 1e-3, 'Target delta.', flag_values=FLAGS)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the Monte Carlo draws.', flag_values=FLAGS)


def _pld(q, noise_multiplier, count, delta):
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(noise_multiplier)), count)
  return accountant.get_epsilon(delta)


def main(argv):
  del argv
  n, bands, sigma, q, delta = _ROUNDS.value, _BANDS.value, _SIGMA.value, _Q.value, _DELTA.value
  try:
    sample_counts = [int(value) for value in _NUM_SAMPLES.value]
  except ValueError:
    flag_parsing.exit_with_error(f'`num_samples` must be integers, got {_NUM_SAMPLES.value}.', FLAGS)
  identity = banded.BandedStrategy.from_toeplitz([1.0], n)
  toeplitz = banded.BandedStrategy.from_toeplitz(banded.fhu_coefficients(bands), n)
  q_band = min(1.0, bands * q)
  cases = [
      ('identity, Poisson', identity, dict(sampling='cyclic_poisson', sampling_prob=q, bands=1)),
      ('identity, min_sep 1', identity, dict(sampling='min_sep', sampling_prob=q, min_sep=1)),
      (f'identity, balls-in-bins {bands}', identity, dict(sampling='balls_in_bins', bands=bands)),
      (f'banded {bands}, cyclic Poisson', toeplitz,
       dict(sampling='cyclic_poisson', sampling_prob=q_band, bands=bands)),
      (f'banded {bands}, min_sep {bands}', toeplitz,
       dict(sampling='min_sep', sampling_prob=q_band, min_sep=bands)),
  ]
  kappa = float(np.linalg.norm(banded.fhu_coefficients(bands)))  # largest column norm
  anchors = {
      'identity': harness.timed(lambda: _pld(q, sigma, n, delta)),
      'banded': harness.timed(lambda: _pld(q_band, sigma / kappa, math.ceil(n / bands), delta)),
  }
  print(f'n={n} sigma={sigma} delta={delta} q={q} (banded: q={q_band:g}, {bands} bands)')
  for name, anchor in anchors.items():
    print(f'anchor PLD {name}: epsilon {anchor.value:.4f} in {anchor.wall:.2f} s '
          f'(CPU {anchor.cpu:.2f} s)')
  print(f'{"case":32s} {"samples":>7s} {"wall s":>7s} {"CPU s":>7s} {"x PLD":>6s}  '
        'epsilon [lower, upper]  method')
  for name, strategy, kwargs in cases:
    anchor_seconds = anchors['identity' if name.startswith('identity') else 'banded'].wall
    for count in sample_counts:
      try:
        timing = harness.timed(lambda s=strategy, c=count, k=kwargs: monte_carlo.monte_carlo_epsilon(
            s, sigma, num_rounds=n, delta=delta, num_samples=c, seed=_SEED.value, **k))
      except ValueError as e:
        flag_parsing.exit_with_error(e, FLAGS)
      result, seconds, cpu = timing.value, timing.wall, timing.cpu
      print(f'{name:32s} {count:7d} {seconds:7.2f} {cpu:7.2f} '
            f'{harness.ratio(seconds, anchor_seconds):6.1f}  '
            f'{result.epsilon:.4f} [{result.epsilon_lower:.4f}, {result.epsilon_upper:.4f}]  '
            f'{result.method}', flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
