"""Old flag names accepted for one release (see CHANGELOG.md), one table for every binary.

`define_aliases(flag_values)` defines `--old` for each entry of `ALIASES` whose new flag the binary
has, with the new flag's type and a help text that points to the new name; after parsing,
`apply_aliases(flag_values)` (called by `flag_parsing.flags_parser`) copies each given old value to
its new flag, with a `DpFtrlDeprecationWarning` and an absl warning, and refuses both at once.
"""

import re
import warnings

from absl import flags, logging

from dp_ftrl_tff import _deprecation

#: Deprecated flag name -> today's name.
ALIASES = {
    'aggregator': 'mechanism',
    'delta': 'target_delta',
    'blt_theta': 'theta',
    'blt_omega': 'omega',
    'buffers': 'num_buffers',
    'bands': 'num_bands',
    'tree_completion': 'completion',
}


def define_aliases(flag_values: flags.FlagValues) -> None:
  """Defines each alias of `ALIASES` whose new flag is defined on `flag_values`."""
  for old, new in ALIASES.items():
    if new not in flag_values or old in flag_values:
      continue
    target = flag_values[new]
    flag = flags.Flag(target.parser, target.serializer, old, None, f'Deprecated: use --{new}.',
                      boolean=target.boolean)
    flags.DEFINE_flag(flag, flag_values=flag_values)


def apply_aliases(flag_values: flags.FlagValues) -> None:
  """Moves the values given under old names to the new flags.

  Raises:
    flags.IllegalFlagValueError: when both the old and the new name were given.
  """
  for old, new in ALIASES.items():
    if old not in flag_values or not flag_values[old].present:
      continue
    if flag_values[new].present:
      raise flags.IllegalFlagValueError(f'--{old} is the deprecated name of --{new}; give only '
                                        f'--{new}.')
    message = f'--{old} is deprecated and will be removed; use --{new}.'
    warnings.warn(message, _deprecation.DpFtrlDeprecationWarning, stacklevel=2)
    logging.warning('%s', message)
    setattr(flag_values, new, flag_values[old].value)  # runs the new flag's validators
    flag_values[new].present = flag_values[old].present


def typed_names(text: str, flag_values: flags.FlagValues) -> str:
  """`text` with each `--new` flag written as the deprecated `--old` the user typed instead."""
  for old, new in ALIASES.items():
    if old in flag_values and flag_values[old].present:
      text = re.sub(rf'--{new}\b', f'--{old}', text)
  return text
