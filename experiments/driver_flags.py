"""The flags both simulation drivers share, defined on the driver's own `FlagValues` when it starts.

Nothing is defined at import: a binary calls `define_common_flags(flag_values)` on its own
`flags.FlagValues()`, so every binary module can be imported in one process (no
`DuplicateFlagError`), and `config_from_flags` turns the parsed values into a `RunConfig`.
Units and conventions are in each flag's help; rounds are 0-based, `--min_sep` = b (TF-Privacy's
min_separation + 1), the noise multiplier is relative to the clip norm.
"""

import dataclasses
from typing import Any, Dict

from absl import flags

from dp_ftrl_tff import _deprecated_flags
from dp_ftrl_tff.accounting import zcdp
from experiments import run_config

#: Deprecated flag names (one release, see CHANGELOG.md) -> today's names.
DEPRECATED_FLAGS = {'aggregator': 'mechanism'}


def define_common_flags(fv: flags.FlagValues) -> None:
  """Defines the shared driver flags (and their deprecated aliases) on `fv`."""
  d = dict(flag_values=fv)
  flags.DEFINE_string('root_output_dir', None, 'Root directory of all runs (required).', **d)
  flags.DEFINE_string('experiment_name', 'run', 'Run directory name under --root_output_dir.', **d)
  flags.DEFINE_integer('rounds', 20, 'Number of training rounds n.', **d)
  flags.DEFINE_integer('clients_per_round', None,
                       'Clients per round m of the min-sep sampler, also the fixed denominator of '
                       f'the mean (default {run_config.DEFAULT_CLIENTS_PER_ROUND}). Not with a '
                       'Poisson --sampler: the denominator is then the expected cohort size.', **d)
  flags.DEFINE_float('client_learning_rate', 0.1, 'Client SGD learning rate.', **d)
  flags.DEFINE_integer('client_batch_size', 16, 'Client batch size (examples).', **d)
  flags.DEFINE_integer('client_epochs', 1, 'Local epochs per round.', **d)
  flags.DEFINE_float('server_learning_rate', 1.0, 'Server SGD learning rate.', **d)
  flags.DEFINE_float('server_momentum', 0.9, 'Server heavy-ball momentum in [0, 1).', **d)
  flags.DEFINE_enum('mechanism', 'blt', list(run_config.MECHANISMS),
                    'Noise mechanism: gaussian (DP-SGD), tree (vanilla), tree_efficient (Honaker), '
                    'banded (BandMF), blt, bsr (banded square root) or bisr (banded inverse square '
                    'root).', **d)
  flags.DEFINE_string('mechanism_file', None,
                      'Strategy file (BLT .json / banded .npz from `python -m dp_ftrl_tff.mechanisms '
                      'optimize`). Without it, banded and BLT are optimized at start.', **d)
  flags.DEFINE_integer('num_bands', None,
                       'Bands b-hat of BandMF when optimizing, or of bsr / bisr (default: '
                       'min(min_sep, rounds)).', **d)
  flags.DEFINE_integer('num_buffers', None,
                       'BLT buffers d when optimizing (default: chosen by the optimizer).', **d)
  flags.DEFINE_enum('banded_beyond_max_rounds', 'error', list(run_config.BEYOND_MAX_ROUNDS),
                    'A banded strategy covers the rounds it was built for: past them, stop with an '
                    'error, or restart (a new noise segment every max_rounds rounds, accounted as '
                    'its own mechanism; server momentum reset). A resumed run may switch to '
                    'restart to train for more --rounds.', **d)
  flags.DEFINE_float('noise_multiplier', 1.0,
                     'sigma: noise std on the sum of clipped updates, relative to the clip norm '
                     '(excludes --target_epsilon).', **d)
  flags.DEFINE_float('target_epsilon', None,
                     'Calibrate the noise multiplier at start to this epsilon at --target_delta, for '
                     'the declared participation, the mechanism and its restarts (excludes '
                     '--noise_multiplier).', **d)
  flags.DEFINE_float('clip_norm', 1.0, 'L2 clip norm zeta (the initial clip if adaptive).', **d)
  flags.DEFINE_bool('adaptive_clipping', False, 'Quantile-based adaptive clipping (Gboard Alg. 1).',
                    **d)
  flags.DEFINE_float('target_unclipped_quantile', 0.5, 'Adaptive clipping: target quantile.', **d)
  flags.DEFINE_float('clip_learning_rate', 0.2, 'Adaptive clipping: geometric learning rate.', **d)
  flags.DEFINE_float('clipped_count_stddev', None,
                     'Adaptive clipping: noise std on the clipped-count sum (default '
                     'clients_per_round / 20).', **d)
  flags.DEFINE_integer('restart_warmup', None,
                       'First restart round (0-based); needs --restart_period.', **d)
  flags.DEFINE_integer('restart_period', None,
                       'Rounds between mechanism restarts (e.g. an epoch).', **d)
  flags.DEFINE_integer('min_sep', 1,
                       'b: rounds between two participations of a client, r2 - r1 >= b.', **d)
  flags.DEFINE_integer('max_participations', None,
                       'k: cap on participations per client (default: none).', **d)
  flags.DEFINE_enum('sampler', 'min_sep', list(run_config.SAMPLERS),
                    'Client sampler: min_sep (exactly --clients_per_round clients whose min-sep '
                    'timer expired), poisson (each client with probability --sampling_prob every '
                    'round) or cyclic_poisson (--sampling_groups fixed groups, round t draws group '
                    't mod groups with probability --sampling_prob; min_sep = groups).', **d)
  flags.DEFINE_float('sampling_prob', None,
                     'q in (0, 1]: a client\'s inclusion probability per eligible round (Poisson '
                     'samplers; the mean divides by q * population / groups).', **d)
  flags.DEFINE_integer('sampling_groups', None,
                       'cyclic_poisson: number of groups b-hat (default: --num_bands with '
                       '--mechanism=banded).', **d)
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
  flags.DEFINE_string('data', 'synthetic',
                      '"synthetic", "tff" (TFF loader) or a local cache dir / SQLite file.', **d)
  flags.DEFINE_integer('synthetic_num_clients', 1000, 'Synthetic data: population size.', **d)
  flags.DEFINE_integer('synthetic_examples_per_client', 20,
                       'Synthetic data: mean examples per client.', **d)
  flags.DEFINE_integer('seed', 0, 'Seed of the data, model init and client sampling.', **d)
  flags.DEFINE_integer('noise_seed', None,
                       'Noise seed (default: OS entropy, stored in the checkpoint).', **d)
  flags.DEFINE_integer('checkpoint_every', 10, 'Checkpoint every k rounds.', **d)
  flags.DEFINE_integer('eval_every', 10, 'Evaluate on the test set every k rounds.', **d)
  flags.DEFINE_integer('eval_max_examples', 10000, 'Test examples used per evaluation.', **d)
  flags.DEFINE_float('target_delta', zcdp.DEFAULT_DELTA,
                     'delta of the reported (epsilon, delta).', **d)
  flags.DEFINE_string('workers', None,
                      'host:port,... of TFF workers (`python -m experiments.workers start`) to '
                      'split each round\'s clients across; default: run locally.', **d)
  flags.DEFINE_bool('debug', False, 'On an error, print the traceback before the one-line message.',
                    **d)
  for old, new in DEPRECATED_FLAGS.items():
    _deprecated_flags.define_alias(old, new, fv)


def config_from_flags(fv: flags.FlagValues, task_settings: Dict[str, Any]) -> run_config.RunConfig:
  """A `RunConfig` from the parsed common flags plus the driver's own settings."""
  _deprecated_flags.apply_aliases(fv, DEPRECATED_FLAGS)
  names = [f.name for f in dataclasses.fields(run_config.RunConfig) if f.name != 'task']
  values = {name: fv[name].value for name in names}
  if fv['target_epsilon'].value is not None:
    if fv['noise_multiplier'].present:
      raise ValueError('--target_epsilon excludes --noise_multiplier (the noise multiplier is '
                       'calibrated to the target): give only one of them.')
    values['noise_multiplier'] = None
  return run_config.RunConfig(**values, task=dict(task_settings))
