"""Times the BandMF optimizer (general banded and banded Toeplitz) and prints its losses.

Default setting: the StackOverflow one of the BandMF and BLT papers, n = 2052 rounds, 342 bands,
k = 6 participations, min_sep = 342. Targets: the BLT paper Table 3 BandMF row (MaxLoss 10.21,
RmsLoss 8.60; the printed headers are swapped) and the DESIGN.md anchor (a dense BandMF optimizer took
41 minutes on this machine type).

  .venv/bin/python -m experiments.benchmarks.banded_bench [--num_rounds=2052 --num_bands=342 ...]
"""

import time

from absl import app, flags

from dp_ftrl_tff.mechanisms import banded
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from experiments import flag_parsing

FLAGS = flags.FlagValues()
_NUM_ROUNDS = flags.DEFINE_integer('num_rounds', 2052, 'n.', flag_values=FLAGS)
_NUM_BANDS = flags.DEFINE_integer('num_bands', 342, 'Bands b-hat.', flag_values=FLAGS)
_MIN_SEP = flags.DEFINE_integer('min_sep', 342, 'b (rounds between participations + 1).', flag_values=FLAGS)
_MAX_PARTICIPATIONS = flags.DEFINE_integer('max_participations', 6, 'k.', flag_values=FLAGS)
_MAX_ITERATIONS = flags.DEFINE_integer('max_iterations', 100, 'L-BFGS iterations per stage.', flag_values=FLAGS)
_ERROR = flags.DEFINE_enum('error', 'rms', ['rms', 'max'], 'Optimized error.', flag_values=FLAGS)


def main(argv):
  del argv
  participation = ParticipationSchema.b_min_sep(_MIN_SEP.value, _MAX_PARTICIPATIONS.value)
  for toeplitz in (True, False):
    start = time.monotonic()
    result = banded.optimize_banded(_NUM_ROUNDS.value, _NUM_BANDS.value, participation,
                                    toeplitz=toeplitz, error=_ERROR.value,
                                    max_iterations=_MAX_ITERATIONS.value)
    seconds = time.monotonic() - start
    stages = {key: value for key, value in result.details.items() if key.endswith('_stage')}
    print(f"{'toeplitz' if toeplitz else 'general '}: {seconds:7.1f} s  "
          f'MaxLoss {result.losses.max_loss:.4f}  RmsLoss {result.losses.rms_loss:.4f}  '
          f'sens^2 {result.losses.sensitivity_squared:.6f}  {stages}', flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
