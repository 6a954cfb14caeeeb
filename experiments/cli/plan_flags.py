"""The flags that describe a run plan, defined once for every binary that takes them.

The mechanisms CLI, the privacy report and the drivers call these definers on their own
`flags.FlagValues()` (so every binary module imports in one process), and read the values back with
the functions below:
  * `define_mechanism_flags`: `--mechanism` (any registered name, checked when the flags are
    parsed), `--mechanism_file`, `--allow_strategy_setting_mismatch`, and one flag per option of the
    registry's mechanisms (`registry.option_table()`: `--num_bands`, `--num_buffers`, `--theta`,
    `--omega`, `--error`, `--toeplitz`, `--completion`, ...), its help text assembled from the
    entries that have it. `mechanism_options` returns the given ones, for
    `mechanisms.resolve.resolve_strategy`.
  * `define_setting_flags`: `--rounds`, `--min_sep`, `--max_participations` (and `--fixed_epoch`),
    `--target_delta`; `participation` builds the declared `ParticipationSchema`.
  * `define_noise_flags`: `--noise_multiplier`, `--target_epsilon` (and `--target_rho`),
    `--clipped_count_stddev`.
  * `define_restart_flags`: `--restart_rounds` or `--restart_warmup` with `--restart_period`, and
    `--banded_beyond_max_rounds`; `restarts` builds the `RestartSchedule`.
  * `define_sampling_flags`: `--sampling_prob`, `--sampling_groups`.
Units and conventions are in each flag's help: rounds are 0-based, `--min_sep` = b (TF-Privacy's
min_separation + 1), noise multipliers are relative to the clip norm.
"""

from typing import Any, Dict, Optional

from absl import flags

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import zcdp_epsilon
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import registry


def _mechanism_help(streaming_only: bool) -> str:
  names = ', '.join(f'{m.name} ({m.summary})' for m in registry.entries()
                    if m.streams or not streaming_only)
  return f'Noise mechanism, one of: {names}.'


def _option_help(option: registry.Option, owners) -> str:
  if not owners:
    return f'{option.help} Applies to none of the mechanisms of this binary.'
  defaults = ('' if option.kind == 'bool' or len(owners) == 1 else
              ' Defaults: ' + ', '.join(f'{name}: {registry.entry(name).option(option.name).default}'
                                        for name in owners) + '.')
  return f'{option.help} Applies to: {", ".join(owners)}.{defaults}'


def _define_option(option: registry.Option, owners, fv: flags.FlagValues) -> None:
  """One flag for a registry option; its default is None (the mechanism's own) but for bools."""
  kwargs = dict(flag_values=fv, help=_option_help(option, owners))
  if option.kind == 'int':
    flags.DEFINE_integer(option.name, None, lower_bound=1, **kwargs)
  elif option.kind == 'floats':
    flags.DEFINE_list(option.name, None, **kwargs)
  elif option.kind == 'bool':
    flags.DEFINE_bool(option.name, bool(option.default), **kwargs)
  else:
    flags.DEFINE_enum(option.name, None, list(option.choices), **kwargs)


def define_mechanism_flags(fv: flags.FlagValues, *, default: Optional[str] = None,
                           streaming_only: bool = False, setting_check: bool = True) -> None:
  """Defines `--mechanism`, `--mechanism_file`, `--allow_strategy_setting_mismatch` (with
  `setting_check`: the binary checks a strategy file's setting against the run's) and the
  registry's option flags on `fv` (`streaming_only`: only mechanisms an aggregator can run)."""
  flags.DEFINE_string('mechanism', default, _mechanism_help(streaming_only), flag_values=fv)
  names = lambda: registry.names(streaming_only=streaming_only)  # noqa: E731  (read when parsed)
  flags.register_validator(
      'mechanism', lambda value: value is None or value in names(),
      message=f'--mechanism must be one of the registered mechanisms <{"|".join(names())}>.',
      flag_values=fv)
  flags.DEFINE_string('mechanism_file', None,
                      'Strategy file (from `python -m experiments.mechanisms_cli optimize --output=`): '
                      'a BLT .json, a banded .npz, ...; it must be made for the run\'s rounds, '
                      'min_sep and max_participations.', flag_values=fv)
  if setting_check:
    flags.DEFINE_bool('allow_strategy_setting_mismatch', False,
                      'Accept a --mechanism_file optimized for other rounds / min_sep / '
                      'max_participations (with a warning in the report) instead of refusing it.',
                      flag_values=fv)
  # Every option is a flag (`mechanism_options` reads them all); its help names only the
  # mechanisms this binary's --mechanism accepts (a driver's --completion: not tree_full).
  for name, (option, owners) in registry.option_table().items():
    if name not in fv:
      _define_option(option, tuple(o for o in owners if o in names()), fv)


def mechanism_options(fv: flags.FlagValues) -> Dict[str, Any]:
  """{option: value} of the registry's option flags that were given (lists as floats)."""
  options = {}
  for name, (option, _) in registry.option_table().items():
    flag = fv[name]
    if not flag.present or flag.value is None:
      continue
    value = flag.value
    if option.kind == 'floats':
      try:
        value = [float(v) for v in value]
      except ValueError:
        raise ValueError(f'`{name}` must be comma-separated numbers, got {",".join(value)!r}.'
                         ) from None
    options[name] = value
  return options


def define_setting_flags(fv: flags.FlagValues, *, rounds: Optional[int] = None,
                         min_sep: Optional[int] = None, fixed_epoch: bool = False) -> None:
  """Defines the run's setting: `--rounds`, `--min_sep`, `--max_participations` (and
  `--fixed_epoch`), `--target_delta`, with the binary's defaults."""
  flags.DEFINE_integer('rounds', rounds, 'Number of training rounds n (0-based rounds 0 .. n-1).',
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('min_sep', min_sep,
                       'b: two participations r1 < r2 of one client satisfy r2 - r1 >= b '
                       '(TF-Privacy\'s min_separation + 1).', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('max_participations', None,
                       'k: at most k participations per client (default: as many as --min_sep '
                       'allows, ceil(n / b)).', lower_bound=1, flag_values=fv)
  if fixed_epoch:
    flags.DEFINE_bool('fixed_epoch', False, 'The declared schema is fixed-epoch (k epochs of '
                      '--min_sep rounds; needs --max_participations).', flag_values=fv)
  flags.DEFINE_float('target_delta', zcdp_epsilon.DEFAULT_DELTA,
                     'delta of the reported (epsilon, delta), in (0, 1).', flag_values=fv)
  flags.register_validator('target_delta', lambda value: 0.0 < value < 1.0,
                           '--target_delta must lie in (0, 1).', flag_values=fv)


def participation(fv: flags.FlagValues) -> Optional[participation_lib.ParticipationSchema]:
  """The declared `ParticipationSchema`, or None without `--min_sep`."""
  fixed_epoch = 'fixed_epoch' in fv and fv['fixed_epoch'].value
  if fv['min_sep'].value is None:
    if fv['max_participations'].value is not None or fixed_epoch:
      raise ValueError('`max_participations` and `fixed_epoch` need `min_sep`.')
    return None
  return participation_lib.ParticipationSchema(min_sep=fv['min_sep'].value,
                                               max_participations=fv['max_participations'].value,
                                               fixed_epoch=fixed_epoch)


def define_noise_flags(fv: flags.FlagValues, *, noise_multiplier: Optional[float] = None,
                       target_rho: bool = False, adaptive: bool = True) -> None:
  """Defines `--noise_multiplier` (default `noise_multiplier`), `--target_epsilon` (and
  `--target_rho`) and (with `adaptive`) adaptive clipping's `--clipped_count_stddev`."""
  flags.DEFINE_float('noise_multiplier', noise_multiplier,
                     'sigma: noise std on the sum of clipped updates, relative to the clip norm '
                     '(excludes the calibration targets).', flag_values=fv)
  flags.DEFINE_float('target_epsilon', None,
                     'Calibrate the noise multiplier to this epsilon at --target_delta, for the '
                     'participation, the mechanism and its restarts (excludes '
                     '--noise_multiplier).', flag_values=fv)
  if target_rho:
    flags.DEFINE_float('target_rho', None, 'Calibrate the noise multiplier to this rho-zCDP.',
                       flag_values=fv)
  if not adaptive:
    return
  flags.DEFINE_float('clipped_count_stddev', None,
                     'Adaptive clipping: noise std on the clipped-count sum (default '
                     'clients_per_round / 20).', flag_values=fv)


def define_restart_flags(fv: flags.FlagValues) -> None:
  """Defines the restarts: `--restart_rounds`, or `--restart_warmup` with `--restart_period`; and
  `--banded_beyond_max_rounds`, what a banded strategy does past the rounds it was built for."""
  flags.DEFINE_enum('banded_beyond_max_rounds', 'error', list(plan_lib.BEYOND_MAX_ROUNDS),
                    'A banded strategy covers the rounds it was built for: past them, stop with an '
                    'error, or restart (a new noise segment every max_rounds rounds, accounted as '
                    'its own mechanism; server momentum reset). A resumed run may switch to '
                    'restart to train for more --rounds.', flag_values=fv)
  flags.DEFINE_list('restart_rounds', None,
                    '0-based rounds at which the noise restarts (excludes --restart_period).',
                    flag_values=fv)
  flags.DEFINE_integer('restart_warmup', None,
                       'First restart round (0-based; default: --restart_period); needs '
                       '--restart_period.', lower_bound=0, flag_values=fv)
  flags.DEFINE_integer('restart_period', None,
                       'Rounds between restarts (e.g. an epoch): restarts at rounds warmup + i * '
                       'period.', lower_bound=1, flag_values=fv)


def restart_rounds(values) -> Optional[tuple]:
  """`--restart_rounds` as ints, or None."""
  if values is None:
    return None
  try:
    return tuple(int(v) for v in values)
  except ValueError:
    raise ValueError(f'`restart_rounds` must be integers, got {",".join(values)!r}.') from None


def define_sampling_flags(fv: flags.FlagValues) -> None:
  """Defines the random sampling's `--sampling_prob` and `--sampling_groups`."""
  flags.DEFINE_float('sampling_prob', None,
                     'q in [2^-52, 1]: a client\'s inclusion probability in each round its group is '
                     'sampled (Poisson samplers; adds the amplified guarantee, BandMF Thm. 4).',
                     flag_values=fv)
  flags.DEFINE_integer('sampling_groups', None,
                       'Cyclic Poisson sampling: b-hat fixed groups, round t samples group t mod '
                       'b-hat (default 1: Poisson); amplification needs a strategy with at most '
                       'b-hat bands.', flag_values=fv)
