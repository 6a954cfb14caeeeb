"""`make demo`: BLT-DP-FTRL on a synthetic federated EMNIST population with min-sep client sampling.

Runs the EMNIST driver's training loop (`experiments.run.training_loop.run`) for 20 rounds: 1000
synthetic clients, 50 per round, min_sep b = 10 (a client waits 10 rounds before it may return), at
most 2 participations, a BLT strategy optimized at start for (n=20, b=10, k=2), noise multiplier 1,
clip 1, a softmax-regression model so it finishes in a few minutes on 2 cores. Everything is seeded
(data, sampling and model init by `seed`, the noise by `noise_seed`), so two runs print the same
numbers (but for the round times). It prints one line per round (loss, accuracy, round time, ETA),
the privacy report and the test metrics; the run directory (metrics, checkpoints, participation log,
report) is printed at the end and recreated on every call.

Usage: `python -m experiments.demo [--demo_dir=DIR]`.
"""

import os
import shutil
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # before TensorFlow is imported

from absl import app, flags  # noqa: E402

from experiments.cli import flag_parsing  # noqa: E402
from experiments.emnist import run_emnist  # noqa: E402
from experiments.run import driver, run_config, training_loop  # noqa: E402

FLAGS = flags.FlagValues()
flags.DEFINE_string('demo_dir', os.path.join(tempfile.gettempdir(), 'dp_ftrl_tff_demo'),
                    'Directory of the demo run (deleted and recreated).', flag_values=FLAGS)

DEMO_SETTINGS = dict(
    experiment_name='emnist_blt', rounds=20, clients_per_round=50, client_learning_rate=0.1,
    client_batch_size=16, client_epochs=1, server_learning_rate=1.0, server_momentum=0.9,
    mechanism='blt', noise_multiplier=1.0, clip_norm=1.0, min_sep=10, max_participations=2,
    data='synthetic', synthetic_num_clients=1000, synthetic_examples_per_client=20, seed=0,
    noise_seed=0, checkpoint_every=10, eval_every=5, eval_max_examples=2000,
    target_delta=1e-6, task={'model': 'tiny', 'only_digits': True})


def main(argv):
  del argv
  driver.set_up_logging()
  shutil.rmtree(FLAGS.demo_dir, ignore_errors=True)
  config = run_config.RunConfig(root_output_dir=FLAGS.demo_dir, **DEMO_SETTINGS)
  print(f'DP-FTRL demo: BLT noise, {config.synthetic_num_clients} synthetic EMNIST clients, '
        f'{config.clients_per_round} per round, min_sep={config.min_sep}, '
        f'max_participations={config.max_participations}, {config.rounds} rounds.', flush=True)
  result = training_loop.run(run_emnist.build_task(config), config)
  metrics = result['metrics']
  print(f"\nFinal test loss {metrics['eval_loss']:.4f}, test accuracy {metrics['eval_accuracy']:.4f}")
  print(f'Run directory: {config.output_dir}', flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
