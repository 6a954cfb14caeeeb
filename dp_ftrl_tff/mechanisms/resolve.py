"""The one strategy resolver: a mechanism name and what the user gave -> a strategy and its source.

`resolve_strategy` is called by every entry point that needs a strategy (the mechanisms CLI, the
privacy report, the drivers through the run plan, the equal-privacy table, the factory's
classmethods), so each applies the same checks:
  * the name is a registered mechanism (`registry.entry`);
  * a strategy file (or a `Strategy` object) holds a strategy of that mechanism; a file's recorded
    setting (rounds, min_sep, max participations) must match the run's, else
    `StrategySettingMismatchError`, or with `allow_setting_mismatch` a mismatch the caller reports
    as a warning; its path and SHA-256 are recorded;
  * parameter options (`registry.Mechanism.parameter_options`: the BLT's theta and omega, the
    closed forms' num_bands, the trees' completion) and optimizer options apply to the mechanism and
    come complete;
  * without a file or parameters: the parameter-free default, else the optimizer for the run's
    setting (`fallback='optimize'`), the registry's reference strategy (`fallback='reference'`), or a
    ValueError naming what is missing.
The result's `StrategySource` says where the strategy came from; the run plan records it, and every
report of the run shows it. Rounds are 0-based, `min_sep` = b (TF-Privacy's min_separation + 1).
"""

import dataclasses
import os
import time
from typing import Any, Dict, Optional, Tuple

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import base, files, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib

#: Where a strategy came from: a registry default, parameter options, a strategy file, the
#: optimizer, the registry's reference strategy, or an object the caller built.
SOURCE_KINDS = ('default', 'parameters', 'file', 'optimized', 'reference', 'object')
FALLBACKS = ('optimize', 'reference', 'error')


class StrategySettingMismatchError(ValueError):
  """A strategy file was optimized for another setting than the run's (`resolve_strategy`)."""


class StrategyFileError(ValueError):
  """A strategy file exists but cannot be read as one (corrupt, truncated, wrongly typed, invalid
  parameters): bad input, like a missing file (the binaries exit 2 on it, with one line naming
  `mechanism_file` and the path)."""


@dataclasses.dataclass(frozen=True)
class StrategySource:
  """Where a run's strategy came from (recorded in the run plan and shown in its reports).

  Attributes:
    kind: one of `SOURCE_KINDS`.
    path: the strategy file ('file'), else None.
    sha256: the file's SHA-256 hex digest ('file'), else None.
    setting: what the file or the optimizer made the strategy for: `files` setting keys
      (num_rounds, min_sep, max_participations, fixed_epoch, error, losses), or None.
    mismatches: how a file's setting differs from the run's (allowed with a warning).
    seconds: the optimizer's wall time ('optimized'), else None.
  """
  kind: str
  path: Optional[str] = None
  sha256: Optional[str] = None
  setting: Optional[dict] = None
  mismatches: Tuple[str, ...] = ()
  seconds: Optional[float] = None

  def __post_init__(self):
    _validation.check_one_of(self.kind, 'kind', SOURCE_KINDS)
    object.__setattr__(self, 'mismatches', tuple(str(m) for m in self.mismatches))

  def describe(self) -> str:
    """One line, e.g. 'file /tmp/blt.json (sha256 ab12...)' or 'optimized for n=20, ... in 1.2 s'."""
    if self.kind == 'file':
      text = f'file {self.path} (sha256 {self.sha256[:12]}...)'
      return text + (f', optimized for another setting: {"; ".join(self.mismatches)}'
                     if self.mismatches else '')
    if self.kind == 'optimized':
      setting = self.setting or {}
      return (f"optimized for n={setting.get('num_rounds')}, min_sep={setting.get('min_sep')}, "
              f"max_participations={setting.get('max_participations')} in {self.seconds:.1f} s")
    return {'default': 'parameter-free', 'parameters': 'given parameters',
            'reference': "the registry's reference strategy", 'object': 'given strategy'}[self.kind]

  def file_record(self) -> Optional[dict]:
    """{'path', 'sha256', 'setting', 'mismatches'} of a strategy file (a report's
    `strategy_file`), or None when the strategy did not come from a file."""
    if self.kind != 'file':
      return None
    return {'path': self.path, 'sha256': self.sha256, 'setting': self.setting,
            'mismatches': list(self.mismatches)}

  def to_config(self) -> dict:
    return {**dataclasses.asdict(self), 'mismatches': list(self.mismatches)}

  @classmethod
  def from_config(cls, config: dict) -> 'StrategySource':
    if not isinstance(config, dict):
      raise ValueError(f'`strategy_source` must be a dict, got {config!r}.')
    unknown = sorted(set(config) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f'`strategy_source` has unknown keys {unknown}.')
    return cls(**config)


@dataclasses.dataclass(frozen=True)
class ResolvedStrategy:
  """What `resolve_strategy` returns: the `strategy`, its `source`, and the optimizer's
  `OptimizationResult` when the strategy was optimized (else None)."""
  strategy: base.Strategy
  source: StrategySource
  optimization: Optional[base.OptimizationResult] = None


def _given(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """The options that were given (None values are 'not given'), each applying to some mechanism."""
  if options is not None and not isinstance(options, dict):
    raise ValueError(f'`options` must be a dict, got {options!r}.')
  return {name: value for name, value in (options or {}).items() if value is not None}


def _from_file(mechanism, given, path, num_rounds, participation,
               allow_setting_mismatch) -> ResolvedStrategy:
  """The strategy of a file (`path`), which must hold a `mechanism` strategy (when given)."""
  if given:
    raise ValueError(f'`mechanism_file` excludes `{sorted(given)[0]}`.')
  if not isinstance(path, (str, os.PathLike)):
    raise ValueError(f'`strategy` must be a Strategy or a file path, got {path!r}.')
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f'`mechanism_file`: no file at {path!r}.')
  try:
    stored = files.read_strategy_file(
        path, None if num_rounds is None else participation_lib.RunSetting(num_rounds, participation))
  except (ValueError, OSError) as error:
    raise StrategyFileError(f'`mechanism_file` {path} is corrupt or not a strategy file ({error}); '
                            'rewrite it with `python -m experiments.mechanisms_cli optimize '
                            '--output=...`.') from error
  if mechanism is not None and stored.strategy.name != registry.entry(mechanism).name:
    raise ValueError(f'`mechanism_file` {path!r} holds a {stored.strategy.name!r} strategy, but '
                     f'`mechanism`={mechanism}.')
  if stored.mismatches and not allow_setting_mismatch:
    raise StrategySettingMismatchError(
        f'`mechanism_file` {path} was optimized for another setting '
        f'({"; ".join(stored.mismatches)}); regenerate it for this run or pass '
        '`allow_strategy_setting_mismatch`.')
  return ResolvedStrategy(stored.strategy, StrategySource(
      'file', path=path, sha256=stored.sha256, setting=stored.setting,
      mismatches=stored.mismatches))


def resolve_strategy(mechanism: Optional[str] = None, *, strategy=None,
                     options: Optional[Dict[str, Any]] = None,
                     num_rounds: Optional[int] = None,
                     participation: Optional[participation_lib.ParticipationSchema] = None,
                     allow_setting_mismatch: bool = False,
                     fallback: str = 'optimize') -> ResolvedStrategy:
  """The strategy of `mechanism` from a file, an object, its parameters or its optimizer.

  Args:
    mechanism: a registry name; may be None with `strategy` (then the file's or object's own).
    strategy: a path to a strategy file (`files.save_strategy`) or a `Strategy`; excludes
      `options`.
    options: {option name: value} of the mechanism's options (`registry.Mechanism.options`:
      parameter and optimizer options alike); None values count as not given. All of them optimizer
      options: the optimizer's strategy for the setting; else parameters.
    num_rounds: the run's n (to optimize for, and to check a file's setting against), or None.
    participation: the run's declared `ParticipationSchema`, or None (a file's setting is then
      compared on the rounds only).
    allow_setting_mismatch: accept a file optimized for another setting; the mismatches are in the
      source (and every report shows them).
    fallback: what a mechanism without a parameter-free default gets when no file and no
      parameters are given: 'optimize' (for the setting), 'reference' (the registry's reference
      strategy) or 'error'.

  Returns:
    A `ResolvedStrategy`.

  Raises:
    ValueError: naming the bad argument (an unknown mechanism, an option that does not apply,
      incomplete parameters, a missing file, a file of another mechanism, nothing to build the
      strategy from).
    StrategySettingMismatchError: a file made for another setting, unless allowed.
    StrategyFileError: a file that exists but cannot be read as a strategy.
  """
  # `num_rounds` and `participation` are checked where they are used: by the strategy file's
  # setting check (`files.read_strategy_file`) and by the optimizer.
  given = _given(options)
  _validation.check_one_of(fallback, 'fallback', FALLBACKS)
  if strategy is not None and not isinstance(strategy, base.Strategy):
    return _from_file(mechanism, given, strategy, num_rounds, participation,
                      allow_setting_mismatch)
  entry = None if mechanism is None else registry.entry(mechanism)
  if strategy is not None:
    if given:
      raise ValueError(f'`mechanism_file` excludes `{sorted(given)[0]}`.')
    if entry is not None and strategy.name != entry.name:
      raise ValueError(f'`strategy` must be a {entry.name} strategy, got {strategy!r}.')
    return ResolvedStrategy(strategy, StrategySource('object'))
  if entry is None:
    raise ValueError('`mechanism` (or `mechanism_file`) is required.')
  start = time.monotonic()
  built, kind, result = entry.build_strategy(given, num_rounds, participation, fallback)
  if result is None:
    return ResolvedStrategy(built, StrategySource(kind))
  return ResolvedStrategy(built, StrategySource(
      kind, setting=files.setting_from_result(result), seconds=time.monotonic() - start), result)
