"""The mechanisms CLI's amplified commands (`amplified`, `select_bands`) and its usage helpers.

`amplified` prints the (epsilon, delta) of a banded strategy, or of a unit largest column norm,
under cyclic Poisson sampling with `--sampling_groups` groups (or the noise multiplier that meets
`--target_epsilon`); `select_bands` picks the number of bands minimizing the amplified error
(`dp_ftrl_tff.accounting.amplification`, `band_selection`; BandMF paper Sec. 5, App. F). The
mechanisms CLI (`experiments/mechanisms_cli.py`) defines these flags with `define_flags` and calls
`run_amplified` / `run_select_bands`; `require`, `forbid` and `check_output` are its usage checks.
"""

import os

from absl import flags

from dp_ftrl_tff.accounting import amplification, amplified_strategy, band_selection
from dp_ftrl_tff.mechanisms import commands, files, memory, registry, resolve
from experiments.cli import plan_flags

#: Flags of the amplified commands only.
AMPLIFICATION_FLAGS = ('sampling_prob', 'sampling_groups', 'dataset_size', 'batch_size',
                       'noise_multiplier', 'target_epsilon', 'accountant', 'candidates')


class UsageError(ValueError):
  """Bad command-line input; the message names the flag (exit status 2)."""


class RuntimeFailure(Exception):
  """A runtime failure: unwritable output, corrupt input file (exit status 1)."""


def define_flags(fv: flags.FlagValues) -> None:
  """The flags of `amplified` and `select_bands` (beside the mechanism and setting flags)."""
  plan_flags.define_sampling_flags(fv)
  flags.DEFINE_integer('dataset_size', None, 'amplified, select_bands: population M split into the '
                       'sampling groups.', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('batch_size', None, 'amplified, select_bands: expected participants per round '
                       'B (sampling prob B / floor(M / H)).', lower_bound=1, flag_values=fv)
  plan_flags.define_noise_flags(fv, adaptive=False)
  flags.DEFINE_enum('accountant', 'pld', list(amplification.ACCOUNTANTS),
                    'amplified, select_bands: dp_accounting accountant.', flag_values=fv)
  flags.DEFINE_string('candidates', None, 'select_bands: the numbers of bands H to search: all '
                      '(default; every H, by branch and bound), pow2 (1, 2, 4, ...: the BandMF '
                      'paper\'s grid) or a comma-separated list.', flag_values=fv)


def require(fv, *names) -> None:
  for name in names:
    if getattr(fv, name) is None:
      raise UsageError(f'--{name} is required.')


def forbid(fv, command: str, *names) -> None:
  """Refuses any of `names` that was given (a value other than None or False)."""
  for name in names:
    if getattr(fv, name) not in (None, False):
      raise UsageError(f'--{name} does not apply to `{command}`.')


def forbid_amplification_flags(fv, command: str) -> None:
  """Refuses the amplified commands' flags given on the command line of another command."""
  for name in AMPLIFICATION_FLAGS:
    if fv[name].present:
      raise UsageError(f'--{name} does not apply to `{command}`.')


def check_output(path: str) -> None:
  """An unwritable --output fails before the optimization, not after it."""
  directory = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise RuntimeFailure(f'--output={path} is a directory; give a file path.')
  if not os.path.isdir(directory):
    raise RuntimeFailure(f'--output={path}: directory {directory} does not exist; create it first.')
  if not os.access(directory, os.W_OK):
    raise RuntimeFailure(f'--output={path}: directory {directory} is not writable.')


def _check_privacy_flags(fv, *, need_target: bool) -> None:
  if not 0 < fv.target_delta < 1:
    raise UsageError(f'--target_delta must lie in (0, 1), got {fv.target_delta!r}.')
  for name in ('noise_multiplier', 'target_epsilon'):
    if getattr(fv, name) is not None and getattr(fv, name) <= 0:
      raise UsageError(f'--{name} must be positive, got {getattr(fv, name)!r}.')
  if need_target:
    require(fv, 'target_epsilon')
  elif (fv.noise_multiplier is None) == (fv.target_epsilon is None):
    raise UsageError('exactly one of --noise_multiplier, --target_epsilon is required.')


def _group_sampling_prob(fv, num_groups: int) -> float:
  """q from --sampling_prob, or B / floor(M / H) from --dataset_size and --batch_size."""
  if fv.sampling_prob is not None:
    forbid(fv, 'amplified --sampling_prob', 'dataset_size', 'batch_size')
    if not 0 < fv.sampling_prob <= 1:
      raise UsageError(f'--sampling_prob must lie in (0, 1], got {fv.sampling_prob!r}.')
    return fv.sampling_prob
  if fv.dataset_size is None or fv.batch_size is None:
    raise UsageError('--sampling_prob (or --dataset_size with --batch_size) is required.')
  try:
    return amplification.group_sampling_prob(fv.dataset_size, fv.batch_size, num_groups)
  except ValueError as e:  # names the flags (`num_groups` is --sampling_groups)
    raise UsageError(str(e)) from None


def _amplified_strategy(fv, num_groups: int):
  """The strategy of --mechanism_file / --mechanism, or None (largest column norm 1)."""
  if fv.mechanism_file is None and fv.mechanism is None:
    return None
  strategy = resolve.resolve_strategy(fv.mechanism, strategy=fv.mechanism_file,
                                      allow_setting_mismatch=True, fallback='error').strategy
  if strategy.max_rounds is not None and fv.rounds > strategy.max_rounds:
    raise UsageError(f'--rounds={fv.rounds} exceeds the {strategy.max_rounds} rounds of the '
                     f'{strategy.name} strategy.')
  memory.check_fits(strategy.name, fv.rounds, losses=False)
  try:
    amplified_strategy.check_banded(strategy, fv.rounds, num_groups)
  except ValueError as e:
    raise UsageError(f'--sampling_groups/--mechanism_file: {e}') from None
  return strategy


def run_amplified(fv) -> dict:
  """The `amplified` command's record."""
  require(fv, 'rounds')
  forbid(fv, 'amplified', 'min_sep', 'max_participations', 'fixed_epoch', 'output', 'candidates',
         *registry.option_table())
  require(fv, 'sampling_groups')
  num_groups = fv.sampling_groups
  _check_privacy_flags(fv, need_target=False)
  q = _group_sampling_prob(fv, num_groups)
  strategy = _amplified_strategy(fv, num_groups)
  kappa = 1.0 if strategy is None else amplified_strategy.largest_column_norm(strategy, fv.rounds)
  record = {'mechanism': None if strategy is None else strategy.name, 'rounds': fv.rounds,
            'sampling_groups': num_groups, 'sampling_prob': q,
            'compositions': amplification.num_compositions(fv.rounds, num_groups),
            'largest_column_norm': kappa}
  sigma = fv.noise_multiplier
  if fv.target_epsilon is not None:
    sigma = kappa * amplification.amplified_noise_multiplier(
        fv.target_epsilon, fv.rounds, num_groups, q, fv.target_delta, fv.accountant)
    record['target_epsilon'] = fv.target_epsilon
  record.update(noise_multiplier=sigma, effective_noise_multiplier=sigma / kappa,
                epsilon=amplification.amplified_epsilon(sigma / kappa, fv.rounds, num_groups, q,
                                                        fv.target_delta, fv.accountant),
                target_delta=fv.target_delta, accountant=fv.accountant)
  if fv.mechanism_file is not None:
    record['mechanism_file'] = fv.mechanism_file
  return record


def run_select_bands(fv) -> dict:
  """The `select_bands` command's record: the choice and every evaluated candidate."""
  require(fv, 'rounds', 'dataset_size', 'batch_size')
  forbid(fv, 'select_bands', 'sampling_prob', 'sampling_groups', 'noise_multiplier', 'min_sep',
         'max_participations', 'fixed_epoch', 'mechanism', 'mechanism_file',
         *(name for name in registry.option_table() if name != 'error'))
  _check_privacy_flags(fv, need_target=True)
  if fv.batch_size > fv.dataset_size:
    raise UsageError(f'--batch_size={fv.batch_size} exceeds --dataset_size={fv.dataset_size}.')
  if fv.output:
    if not fv.output.lower().endswith('.npz'):
      raise UsageError('--output for select_bands must end with .npz (a banded strategy).')
    check_output(fv.output)
  candidates = _candidates(fv)
  memory.check_fits('banded', fv.rounds)
  selection = band_selection.select_bands(
      fv.target_epsilon, fv.target_delta, fv.rounds, fv.dataset_size, fv.batch_size,
      error=fv.error or 'rms', accountant=fv.accountant, candidates=candidates)
  if fv.output:
    files.save_strategy(selection.strategy, fv.output)
  record = {'rounds': fv.rounds, 'dataset_size': fv.dataset_size, 'batch_size': fv.batch_size,
            'target_epsilon': fv.target_epsilon, 'target_delta': fv.target_delta,
            'accountant': fv.accountant, 'error': selection.error,
            'candidate_set': selection.candidate_set, **selection.best.to_dict(),
            'candidates': [c.to_dict() for c in selection.candidates]}
  if fv.output:
    record['output'] = fv.output
  return record


def _candidates(fv):
  """--candidates as `band_selection.select_bands` takes it: None, 'pow2' or a tuple of H."""
  text = (fv.candidates or 'all').strip()
  if text in band_selection.CANDIDATE_SETS:
    candidates = text
  else:
    try:
      candidates = tuple(int(part) for part in text.split(','))
    except ValueError:
      raise UsageError(f'--candidates must be all, pow2 or a comma-separated list of integers, got '
                       f'{fv.candidates!r}.') from None
  try:
    return band_selection.candidate_bands(
        candidates, band_selection.max_bands(fv.rounds, fv.dataset_size, fv.batch_size))
  except ValueError as e:
    raise UsageError(str(e)) from None


def format_selection(record: dict) -> str:
  """`select_bands` as text: the choice, then one line per evaluated candidate."""
  head = commands.format_table({k: v for k, v in record.items() if k != 'candidates'})
  rows = ['num_bands  sampling_prob  compositions  noise_multiplier  loss      rmse']
  rows += [f'{c["num_bands"]:>9}  {c["sampling_prob"]:>13.6g}  {c["compositions"]:>12}  '
           f'{c["noise_multiplier"]:>16.6g}  {c["loss"]:<8.6g}  {c["rmse"]:.6g}'
           for c in record['candidates']]
  return head + '\ncandidates (rmse = noise_multiplier * loss):\n' + '\n'.join(rows)
