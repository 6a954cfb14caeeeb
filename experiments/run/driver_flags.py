"""The flags both simulation drivers share, defined on the driver's own `FlagValues` when it starts.

Nothing is defined at import: a binary calls `define_common_flags(flag_values)` on its own
`flags.FlagValues()`, so every binary module can be imported in one process (no
`DuplicateFlagError`), and `config_from_flags` turns the parsed values into a `DriverConfig`. The flags
that describe the plan (mechanism and its options, setting, noise, restarts, sampling) are
`experiments.cli.plan_flags`', shared with the privacy report and the mechanisms CLI; the training,
clipping, SecAgg, data and run-directory flags are the drivers' own. Units and conventions are in
each flag's help; rounds are 0-based, `--min_sep` = b (TF-Privacy's min_separation + 1), the noise
multiplier is relative to the clip norm.
"""

import dataclasses
from typing import Any, Dict

from absl import flags

from dp_ftrl_tff import sampling
from dp_ftrl_tff.mechanisms import memory
from dp_ftrl_tff.training import run_config
from experiments.cli import plan_flags
from experiments.run import driver_config

#: `DriverConfig.task['program']`: what trains every run, TFF's `train_model` (`training_loop`). Recorded
#: in hparams.json and the checkpoint records: the directory of a run trained by the drivers' own loop
#: of earlier versions, which lacks it and whose checkpoints hold another structure, is refused as a
#: run of other settings instead of failing to load.
PROGRAM = 'train_model'


def define_common_flags(fv: flags.FlagValues) -> None:
  """Defines the shared driver flags on `fv`."""
  _define_run_flags(fv)
  plan_flags.define_mechanism_flags(fv, default='blt', streaming_only=True)
  plan_flags.define_setting_flags(fv, rounds=20, min_sep=1)
  plan_flags.define_noise_flags(fv, noise_multiplier=1.0)
  plan_flags.define_restart_flags(fv)
  plan_flags.define_sampling_flags(fv)
  _define_training_flags(fv)
  _define_clip_and_secure_flags(fv)


def _define_run_flags(fv: flags.FlagValues) -> None:
  d = dict(flag_values=fv)
  flags.DEFINE_string('root_output_dir', None, 'Root directory of all runs (required).', **d)
  flags.DEFINE_string('experiment_name', 'run', 'Run directory name under --root_output_dir (one '
                      'directory name: no "/" or "..", at most 255 bytes).', **d)
  flags.DEFINE_string('data', 'synthetic',
                      '"synthetic", "tff" (TFF loader) or a local cache dir / SQLite file.', **d)
  flags.DEFINE_integer('synthetic_num_clients', 1000, 'Synthetic data: population size.', **d)
  flags.DEFINE_integer('synthetic_examples_per_client', 20,
                       'Synthetic data: mean examples per client.', **d)
  flags.DEFINE_integer('seed', 0, 'Seed of the data, model init and client sampling.', **d)
  flags.DEFINE_integer('noise_seed', None,
                       'Noise seed (default: OS entropy, stored in the checkpoint).', **d)
  flags.DEFINE_integer('canary_clients', 0,
                       'Empirical privacy: insert N canary clients (and N unseen directions) into '
                       'the population; the report then states the measured epsilon beside the '
                       'accounted one (docs/auditing.md). 0: none.', **d)
  flags.DEFINE_integer('checkpoint_every', 10, 'Checkpoint every k rounds.', **d)
  flags.DEFINE_integer('eval_every', 10, 'Evaluate on the test set every k rounds.', **d)
  flags.DEFINE_integer('eval_max_examples', 10000, 'Test examples used per evaluation.', **d)
  flags.DEFINE_string('workers', None,
                      'host:port,... of TFF workers (`python -m experiments.workers start`) to '
                      'split each round\'s clients across; default: run locally.', **d)
  flags.DEFINE_bool('force_report', False,
                    'Rewrite the privacy report of a finished run; without it, rerunning a '
                    'finished run changes nothing.', **d)
  flags.DEFINE_bool('debug', False, 'On an error, print the traceback before the one-line message.',
                    **d)


def _define_training_flags(fv: flags.FlagValues) -> None:
  d = dict(flag_values=fv)
  flags.DEFINE_integer('clients_per_round', None,
                       'Clients per round m of the min-sep sampler, also the fixed denominator of '
                       f'the mean (default {run_config.DEFAULT_CLIENTS_PER_ROUND}). Not with a '
                       'Poisson --sampler: the denominator is then the expected cohort size.', **d)
  flags.DEFINE_enum('sampler', 'min_sep', list(sampling.names()),
                    'Client sampler: min_sep (exactly --clients_per_round clients whose min-sep '
                    'timer expired), poisson (each client with probability --sampling_prob every '
                    'round) or cyclic_poisson (--sampling_groups fixed groups, round t draws group '
                    't mod groups with probability --sampling_prob; min_sep = groups).', **d)
  flags.DEFINE_float('client_learning_rate', 0.1, 'Client SGD learning rate.', **d)
  flags.DEFINE_integer('client_batch_size', 16, 'Client batch size (examples).', **d)
  flags.DEFINE_integer('client_epochs', 1, 'Local epochs per round.', **d)
  flags.DEFINE_float('server_learning_rate', 1.0, 'Server SGD learning rate.', **d)
  flags.DEFINE_float('server_momentum', 0.9, 'Server heavy-ball momentum in [0, 1).', **d)


def _define_clip_and_secure_flags(fv: flags.FlagValues) -> None:
  d = dict(flag_values=fv)
  flags.DEFINE_float('clip_norm', 1.0, 'L2 clip norm zeta (the initial clip if adaptive).', **d)
  flags.DEFINE_bool('adaptive_clipping', False, 'Quantile-based adaptive clipping (Gboard Alg. 1).',
                    **d)
  flags.DEFINE_float('target_unclipped_quantile', 0.5,
                     'Adaptive clipping: target quantile of the update norms, in [0, 1].', **d)
  flags.DEFINE_float('clip_learning_rate', 0.2, 'Adaptive clipping: geometric learning rate.', **d)
  flags.DEFINE_bool('secure_aggregation', False, 'Sum client updates with SecAgg.', **d)
  flags.DEFINE_integer('secure_bits', 20, 'SecAgg field size 2^bits, 1 <= bits <= 22.', **d)
  flags.DEFINE_enum('secure_rotation', 'dft', list(run_config.SECURE_ROTATIONS),
                    'SecAgg rotation before rounding: dft, hd (randomized Hadamard) or none '
                    '(worst-case scale).', **d)
  flags.DEFINE_float('secure_beta', 0.0,
                     'SecAgg conditional stochastic rounding bias beta in [0, 1) (0: '
                     'unconditional).', **d)
  flags.DEFINE_float('secure_modclip_prob', 1e-4,
                     'SecAgg target probability of a modular wrap of the sum, in (0, 1).', **d)


def config_from_flags(fv: flags.FlagValues, task_settings: Dict[str, Any]
                      ) -> driver_config.DriverConfig:
  """A `DriverConfig` from the parsed common flags plus the driver's own settings; a
  `--canary_clients` whose canaries cannot fit in memory is a `memory.MemoryLimitError` (a
  ValueError naming the flag and the arithmetic) before anything is built."""
  special = ('task', 'mechanism_options', 'restart_rounds')
  values = {f.name: fv[f.name].value for f in dataclasses.fields(driver_config.DriverConfig)
            if f.name not in special}
  if fv['target_epsilon'].value is not None:
    if fv['noise_multiplier'].present:
      raise ValueError('`target_epsilon` excludes `noise_multiplier` (the noise multiplier is '
                       'calibrated to the target): give only one of them.')
    values['noise_multiplier'] = None
  config = driver_config.DriverConfig(
      **values, mechanism_options=plan_flags.mechanism_options(fv),
      restart_rounds=plan_flags.restart_rounds(fv.restart_rounds),
      task={**task_settings, 'program': PROGRAM})
  memory.check_canaries_fit(config.canary_clients, config.rounds)
  return config
