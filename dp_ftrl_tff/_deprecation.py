"""Old names accepted for one release (CHANGELOG.md lists them), with one warning category.

`DpFtrlDeprecationWarning` is what every deprecated name of the package warns with, so the tests can
make exactly these warnings errors. `renamed_function` keeps an old function name, `rename_keywords`
old keyword arguments.
"""

import functools
import warnings
from typing import Any, Callable, Dict


class DpFtrlDeprecationWarning(DeprecationWarning):
  """A deprecated name of dp_ftrl_tff was used; the message names its replacement."""


def warn(old: str, new: str, stacklevel: int = 3) -> None:
  """Warns that `old` is deprecated in favour of `new` (attributed `stacklevel` frames up)."""
  warnings.warn(f'`{old}` is deprecated and will be removed; use `{new}`.',
                DpFtrlDeprecationWarning, stacklevel=stacklevel)


def renamed_function(old: str, function: Callable[..., Any]) -> Callable[..., Any]:
  """`function` under its old name `old`, warning at each call."""

  @functools.wraps(function)
  def wrapper(*args, **kwargs):
    warn(old, function.__name__)
    return function(*args, **kwargs)

  wrapper.__name__ = old
  return wrapper


def rename_keywords(kwargs: Dict[str, Any], renames: Dict[str, str]) -> Dict[str, Any]:
  """`kwargs` with each old keyword of `renames` (old -> new) moved to its new name, warning once
  per old name; ValueError when both the old and the new name are given."""
  out = dict(kwargs)
  for old, new in renames.items():
    if old not in out:
      continue
    if new in out:
      raise ValueError(f'`{old}` is the deprecated name of `{new}`; give only `{new}`.')
    warn(old, new, stacklevel=4)
    out[new] = out.pop(old)
  return out
