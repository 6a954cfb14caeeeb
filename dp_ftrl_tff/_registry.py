"""A registry of named entries: the shape the project's extension points share.

The sampler kinds (`dp_ftrl_tff.sampling`), the mechanisms (`dp_ftrl_tff.mechanisms.registry`) and
the report sections (`dp_ftrl_tff.accounting.report_parts`) each keep one `Registry` of their own
entry type: built-in entries that stay, entries added at run time (`register`, removed by
`unregister`, or for a `with` block by `registered`), and names reserved by built-in parts that are
not entries (the report's own sections). An entry is any object with a `name`; a module's own
checks of an entry (e.g. a mechanism's option kinds) run before `register` adds it.
"""

import contextlib
from typing import Dict, Generic, Iterable, Iterator, Sequence, Tuple, TypeVar

Entry = TypeVar('Entry')


class Registry(Generic[Entry]):
  """Entries of `entry_type` by name; errors name the parameter `what` (e.g. 'kind')."""

  def __init__(self, what: str, entry_type: type, type_name: str,
               built_in: Sequence[Entry] = (), reserved_names: Iterable[str] = ()):
    """Args: `what`, the parameter an error names; `entry_type` and its `type_name` in errors
    (e.g. 'registry.Mechanism'); the `built_in` entries, in order; `reserved_names`, names that
    no entry may take."""
    self._what, self._type, self._type_name = what, entry_type, type_name
    self._entries: Dict[str, Entry] = {entry.name: entry for entry in built_in}
    self._fixed = frozenset(self._entries) | frozenset(reserved_names)

  def register(self, entry: Entry) -> None:
    """Adds `entry`; ValueError for another type or a name that is taken."""
    if not isinstance(entry, self._type):
      raise ValueError(f'`{self._what}` must be a {self._type_name}, got {entry!r}.')
    if entry.name in self._entries or entry.name in self._fixed:
      raise ValueError(f'`{self._what}` {entry.name!r} is already registered.')
    self._entries[entry.name] = entry

  def unregister(self, name: str) -> None:
    """Removes an entry added with `register`; ValueError for a built-in or unknown name."""
    if name in self._fixed:
      raise ValueError(f'`name` {name!r} is built in and cannot be removed.')
    self.entry(name)
    del self._entries[name]

  @contextlib.contextmanager
  def registered(self, entry: Entry) -> Iterator[Entry]:
    """`register(entry)` for the duration of a `with` block."""
    self.register(entry)
    try:
      yield entry
    finally:
      self.unregister(entry.name)

  def entry(self, name: str) -> Entry:
    """The entry named `name`; ValueError naming the registered names otherwise."""
    if not isinstance(name, str) or name not in self._entries:
      raise ValueError(f'`{self._what}` must be one of {list(self._entries)}, got {name!r}.')
    return self._entries[name]

  def names(self) -> Tuple[str, ...]:
    """The registered names, built-in first, in registration order."""
    return tuple(self._entries)

  def entries(self) -> Tuple[Entry, ...]:
    """The registered entries, built-in first, in registration order."""
    return tuple(self._entries.values())
