"""Times the exact tree sensitivity (one tree, min-sep participation) and prints its value.

Default setting: the DESIGN.md anchor, TF-Privacy's compute_zcdp_single_tree(noise_multiplier=7,
total_steps=2000, max_participation=6, min_separation=313), i.e. n = 2000, k = 6, min_sep b = 314 in
our convention: squared sensitivity 79 (rho = 79 / 98 = 0.80612). TF-Privacy's recursive DP took 250 s
on this machine type. `--compare_tf_privacy` also times it (slow; loads its accountant module only).

  .venv/bin/python -m experiments.benchmarks.tree_sensitivity_bench [--num_rounds=2000 ...]
"""

import importlib.util
import pathlib

from absl import flags

from dp_ftrl_tff.mechanisms import tree
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_NUM_ROUNDS = flags.DEFINE_integer('num_rounds', 2000, 'n.', flag_values=FLAGS)
_MIN_SEP = flags.DEFINE_integer('min_sep', 314, 'b (TF-Privacy min_separation + 1).', flag_values=FLAGS)
_MAX_PARTICIPATIONS = flags.DEFINE_integer('max_participations', 6, 'k.', flag_values=FLAGS)
_NOISE_MULTIPLIER = flags.DEFINE_float('noise_multiplier', 7.0, 'sigma, for the printed rho.', flag_values=FLAGS)
_REPEATS = harness.define_repeats(FLAGS, 5, 'Timed repetitions (the best is reported).')
_COMPARE = flags.DEFINE_bool('compare_tf_privacy', False, "Also time TF-Privacy's DP (slow).", flag_values=FLAGS)


def _tf_privacy_accountant():
  package = importlib.util.find_spec('tensorflow_privacy')
  path = (pathlib.Path(package.origin).parent / 'privacy' / 'analysis' /
          'tree_aggregation_accountant.py')
  spec = importlib.util.spec_from_file_location('tfp_tree_accountant', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main(argv):
  del argv
  participation = ParticipationSchema.b_min_sep(_MIN_SEP.value, _MAX_PARTICIPATIONS.value)
  ours = harness.best_of(lambda: tree.tree_sensitivity_squared(_NUM_ROUNDS.value, participation),
                         _REPEATS.value)
  rho = ours.value / (2 * _NOISE_MULTIPLIER.value**2)
  print(f'ours: n={_NUM_ROUNDS.value} k={_MAX_PARTICIPATIONS.value} min_sep={_MIN_SEP.value}: '
        f'sens^2 {ours.value}  rho {rho:.5f}  best of {_REPEATS.value} {ours.wall:.3f} s',
        flush=True)
  if _COMPARE.value:
    accountant = _tf_privacy_accountant()
    anchor = harness.timed(lambda: accountant.compute_zcdp_single_tree(
        noise_multiplier=_NOISE_MULTIPLIER.value, total_steps=_NUM_ROUNDS.value,
        max_participation=_MAX_PARTICIPATIONS.value,
        min_separation=participation.tf_privacy_min_separation))
    tfp_rho = anchor.value
    print(f'TF-Privacy: rho {tfp_rho:.5f} (sens^2 {tfp_rho * 2 * _NOISE_MULTIPLIER.value**2:.0f})  '
          f'{anchor.wall:.1f} s; ours / TF-Privacy {harness.ratio(ours.wall, anchor.wall):.2g}',
          flush=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
