"""Old flag names accepted for one release (see CHANGELOG.md), shared by the binaries.

`define_alias(old, new, flag_values)` defines `--old` with the type of `--new` and a help text that
points to the new name; after parsing, `apply_aliases(flag_values, aliases)` copies each given old
value to its new flag, with a DeprecationWarning and an absl warning, and refuses both at once.
"""

import warnings
from typing import Dict

from absl import flags, logging


def define_alias(old: str, new: str, flag_values: flags.FlagValues) -> None:
  """Defines `--old` as a deprecated alias of the already defined `--new`."""
  target = flag_values[new]
  flag = flags.Flag(target.parser, target.serializer, old, None,
                    f'Deprecated: use --{new}.', boolean=target.boolean)
  flags.DEFINE_flag(flag, flag_values=flag_values)


def apply_aliases(flag_values: flags.FlagValues, aliases: Dict[str, str]) -> None:
  """Moves the values given under old names (`aliases`: old -> new) to the new flags.

  Raises:
    flags.IllegalFlagValueError: when both the old and the new name were given.
  """
  for old, new in aliases.items():
    if not flag_values[old].present:
      continue
    if flag_values[new].present:
      raise flags.IllegalFlagValueError(f'--{old} is the deprecated name of --{new}; give only '
                                        f'--{new}.')
    message = f'--{old} is deprecated and will be removed; use --{new}.'
    warnings.warn(message, DeprecationWarning, stacklevel=2)
    logging.warning('%s', message)
    flag_values[new].value = flag_values[old].value
    flag_values[new].present = flag_values[old].present
