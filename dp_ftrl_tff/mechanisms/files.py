"""Saving and loading strategies: JSON for parameter-only strategies, .npz for matrices.

File formats (version 1):
  * JSON (any suffix but .npz): one object `{"format_version": 1, "mechanism": NAME, <the strategy's
    to_config() entries>, "setting": {...}}`, floats written with full precision. Used for 'blt'
    (theta, omega), 'gaussian' and the tree variants.
  * .npz: array entries of the config (e.g. the banded strategy's `band_rows`, float64) stored as
    arrays named `config/<key>`, everything else as a JSON string in the array `metadata`. Loaded with
    `allow_pickle=False`. Used for 'banded'; any strategy may be saved this way.

`setting` (optional) records what the strategy was optimized for: `num_rounds` (n), `min_sep` (b,
TF-Privacy's min_separation + 1), `max_participations` (k or null), `fixed_epoch`, `error` ('max' or
'rms') and `losses` {max_loss, rms_loss, sensitivity_squared} at that setting.

`file_sha256` identifies a file in a report; `setting_mismatches` says how its setting differs from
a run's (the privacy report refuses a strategy optimized for another setting unless told otherwise).

Loading validates the file structure (missing keys, unknown mechanism, bad setting) and then the
parameters through each class's `from_config` (shapes, NaN, a BLT's decays theta outside (0, 1], ...)
and `Strategy.check_noise_stable` (a BLT's inverse decays theta_hat must be real, distinct and in
(-1, 1]: negative ones are stable buffers, |theta_hat| > 1 would make the noise grow geometrically);
every problem is a ValueError naming the field. Saving runs the same stability check, so every file
written can be read back. The strategy class comes from `registry` by mechanism name.
"""

import dataclasses
import hashlib
import io
import json
import math
import os
import zipfile
from typing import Optional, Tuple, Union

import numpy as np

from dp_ftrl_tff import _atomic, _validation
from dp_ftrl_tff.mechanisms import base, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib

FORMAT_VERSION = 1
_RESERVED_KEYS = ('format_version', 'setting')
_LOSS_KEYS = ('max_loss', 'rms_loss', 'sensitivity_squared')
_SETTING_KEYS = ('num_rounds', 'min_sep', 'max_participations', 'fixed_epoch', 'error', 'losses')

def setting_from_result(result: base.OptimizationResult) -> dict:
  """The `setting` dict of an optimizer's `OptimizationResult` (error taken from its details)."""
  if not isinstance(result, base.OptimizationResult):
    raise ValueError(f'`result` must be an OptimizationResult, got {type(result).__name__}.')
  participation = result.participation
  setting = {
      'num_rounds': result.num_rounds,
      'min_sep': participation.min_sep,
      'max_participations': participation.max_participations,
      'fixed_epoch': participation.fixed_epoch,
      'losses': {key: getattr(result.losses, key) for key in _LOSS_KEYS},
  }
  if result.details.get('error') is not None:
    setting['error'] = result.details['error']
  return _check_setting(setting)


def _check_setting(setting) -> dict:
  """Validates a setting dict; returns a normalized copy (ints, floats, bools)."""
  if not isinstance(setting, dict):
    raise ValueError(f'`setting` must be a dict, got {type(setting).__name__}.')
  unknown = sorted(set(setting) - set(_SETTING_KEYS))
  if unknown:
    raise ValueError(f'`setting` has unknown keys {unknown}; allowed: {list(_SETTING_KEYS)}.')
  out = {}
  if 'num_rounds' in setting:
    out['num_rounds'] = _validation.check_positive_int(setting['num_rounds'], 'setting.num_rounds')
  if 'min_sep' in setting:
    out['min_sep'] = _validation.check_positive_int(setting['min_sep'], 'setting.min_sep')
  if setting.get('max_participations') is not None:
    out['max_participations'] = _validation.check_positive_int(setting['max_participations'],
                                                               'setting.max_participations')
  elif 'max_participations' in setting:
    out['max_participations'] = None
  if 'fixed_epoch' in setting:
    if not isinstance(setting['fixed_epoch'], bool):
      raise ValueError(f'`setting.fixed_epoch` must be a bool, got {setting["fixed_epoch"]!r}.')
    out['fixed_epoch'] = setting['fixed_epoch']
  if 'error' in setting:
    out['error'] = _validation.check_one_of(setting['error'], 'setting.error', ('max', 'rms'))
  if 'losses' in setting:
    losses = setting['losses']
    if not isinstance(losses, dict) or sorted(losses) != sorted(_LOSS_KEYS):
      raise ValueError(f'`setting.losses` must be a dict with keys {list(_LOSS_KEYS)}, got '
                       f'{losses!r}.')
    out['losses'] = {key: _validation.check_nonnegative_float(losses[key], f'setting.losses.{key}')
                     for key in _LOSS_KEYS}
  return out


def _is_npz(path) -> bool:
  return os.fspath(path).lower().endswith('.npz')


def _json_ready(value):
  """Config values as JSON types; raises ValueError for arrays (they need .npz)."""
  if isinstance(value, np.ndarray):
    raise ValueError('`path` must end with .npz for a strategy whose config holds arrays.')
  if isinstance(value, (list, tuple)):
    return [_json_ready(v) for v in value]
  if isinstance(value, np.generic):
    return value.item()
  return value


def save_strategy(strategy: base.Strategy, path,
                  setting: Optional[Union[dict, base.OptimizationResult]] = None) -> None:
  """Writes `strategy` (and optionally the setting it was optimized for) to `path`, atomically
  (a temp file in the same directory, renamed into place).

  Args:
    strategy: any `base.Strategy`.
    path: a `.npz` path (arrays) or any other path (JSON).
    setting: a setting dict (see the module docstring) or the `OptimizationResult` it came from.

  Raises:
    ValueError: for a bad strategy (also one whose noise is not stable, see
      `Strategy.check_noise_stable`), setting, or a JSON path for a strategy with array parameters.
  """
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a Strategy, got {type(strategy).__name__}.')
  strategy.check_noise_stable()  # The loader refuses such a file: never write one.
  if isinstance(setting, base.OptimizationResult):
    setting = setting_from_result(setting)
  elif setting is not None:
    setting = _check_setting(setting)
  config = {key: value for key, value in strategy.to_config().items() if key != 'mechanism'}
  reserved = sorted(set(config) & set(_RESERVED_KEYS))
  if reserved:
    raise ValueError(f'`strategy` config uses reserved keys {reserved}.')
  header = {'format_version': FORMAT_VERSION, 'mechanism': strategy.name}
  if _is_npz(path):
    arrays = {f'config/{key}': np.asarray(value, dtype=np.float64)
              for key, value in config.items() if isinstance(value, np.ndarray)}
    metadata = dict(header, **{key: _json_ready(value) for key, value in config.items()
                               if not isinstance(value, np.ndarray)})
    if setting is not None:
      metadata['setting'] = setting
    buffer = io.BytesIO()
    np.savez(buffer, metadata=np.array(json.dumps(metadata, allow_nan=False)), **arrays)
    _atomic.write_bytes(path, buffer.getvalue())
    return
  document = dict(header, **{key: _json_ready(value) for key, value in config.items()})
  if setting is not None:
    document['setting'] = setting
  _atomic.write_bytes(path, (json.dumps(document, indent=2, allow_nan=False) + '\n').encode('utf-8'))


def _read_document(path) -> dict:
  """The file's content as one dict (arrays as float64 ndarrays)."""
  if _is_npz(path):
    try:
      with np.load(path, allow_pickle=False) as data:
        arrays = {name: np.asarray(data[name]) for name in data.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
      raise ValueError(f'`path` {os.fspath(path)!r} is not a readable strategy .npz file: {e}') from e
    if 'metadata' not in arrays:
      raise ValueError(f'`metadata` is missing from {os.fspath(path)!r}.')
    try:
      document = json.loads(str(arrays.pop('metadata')))
    except json.JSONDecodeError as e:
      raise ValueError(f'`metadata` in {os.fspath(path)!r} is not valid JSON: {e}') from e
    if not isinstance(document, dict):
      raise ValueError(f'`metadata` in {os.fspath(path)!r} must be a JSON object.')
    for name, value in arrays.items():
      if not name.startswith('config/'):
        raise ValueError(f'Unexpected array `{name}` in {os.fspath(path)!r}.')
      key = name[len('config/'):]
      if not np.issubdtype(value.dtype, np.number) or np.issubdtype(value.dtype, np.complexfloating):
        raise ValueError(f'`{key}` must be a real numeric array, got dtype {value.dtype}.')
      document[key] = value.astype(np.float64)
    return document
  try:
    with open(path) as f:
      document = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f'`path` {os.fspath(path)!r} is not a readable strategy JSON file: {e}') from e
  if not isinstance(document, dict):
    raise ValueError(f'`path` {os.fspath(path)!r} must hold a JSON object.')
  return document


def load_strategy_and_setting(path) -> Tuple[base.Strategy, Optional[dict]]:
  """(strategy, setting or None) from a file written by `save_strategy`."""
  return _from_document(_read_document(path))


def _from_document(document: dict) -> Tuple[base.Strategy, Optional[dict]]:
  setting = _document_setting(document)
  return _document_strategy(document), setting


def _document_setting(document: dict) -> Optional[dict]:
  """The checked setting of a file's document (None when it records none)."""
  version = document.get('format_version', FORMAT_VERSION)
  if version != FORMAT_VERSION:
    raise ValueError(f'`format_version` must be {FORMAT_VERSION}, got {version!r}.')
  setting = document.get('setting')
  return None if setting is None else _check_setting(setting)


def _document_strategy(document: dict) -> base.Strategy:
  config = {key: value for key, value in document.items() if key not in _RESERVED_KEYS}
  for key, value in config.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise ValueError(f'`{key}` must be finite, got {value!r}.')
  strategy = registry.strategy_from_config(config)
  strategy.check_noise_stable()
  return strategy


def load_strategy(path) -> base.Strategy:
  """The strategy stored in `path` by `save_strategy` (see `load_strategy_and_setting`)."""
  return load_strategy_and_setting(path)[0]


def file_sha256(path) -> str:
  """The SHA-256 hex digest of the file at `path` (what a report records to identify a strategy)."""
  digest = hashlib.sha256()
  try:
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
  except OSError as e:
    raise ValueError(f'`path` {os.fspath(path)!r} cannot be read: {e}') from e
  return digest.hexdigest()


def setting_mismatches(setting: Optional[dict], run: participation_lib.RunSetting
                       ) -> Tuple[str, ...]:
  """How a strategy file's `setting` differs from the setting of a `run` (empty: it matches).

  Compares the recorded `num_rounds` (n), `min_sep` (b), `fixed_epoch` and the effective
  max_participations min(k, ceil(n / b)) of each side; entries the file does not record are not
  compared, a file without a setting matches everything, and a run without a participation schema
  (known only from its participation log) is compared on its rounds only.

  Args:
    setting: a file's setting (from `load_strategy_and_setting`) or None.
    run: the run's `participation.RunSetting`.

  Returns:
    One 'key: optimized for X, the run has Y' string per difference.
  """
  run = _check_run(run)
  return () if setting is None else _mismatches(_check_setting(setting), run)


def _check_run(run) -> participation_lib.RunSetting:
  if not isinstance(run, participation_lib.RunSetting):
    raise ValueError(f'`run` must be a RunSetting, got {run!r}.')
  return run


def _mismatches(setting: dict, run: participation_lib.RunSetting) -> Tuple[str, ...]:
  """`setting_mismatches` of a checked setting."""
  out = []
  participation = run.participation
  compared = {'num_rounds': run.num_rounds}
  if participation is not None:
    compared.update(min_sep=participation.min_sep, fixed_epoch=participation.fixed_epoch)
  for key, value in compared.items():
    if key in setting and setting[key] != value:
      out.append(f'{key}: optimized for {setting[key]}, the run has {value}')
  if participation is not None and 'max_participations' in setting:
    k = setting['max_participations']
    if 'min_sep' in setting and 'num_rounds' in setting:
      k = participation_lib.RunSetting(setting['num_rounds'], participation_lib.ParticipationSchema(
          setting['min_sep'], k)).effective_max_participations
    run_k = run.effective_max_participations
    if k != run_k:
      out.append(f'max_participations: optimized for {k}, the run has {run_k}')
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class StrategyFile:
  """A strategy file read for a run (`read_strategy_file`).

  Attributes:
    strategy: the `Strategy` it holds.
    setting: the setting it was made for (`load_strategy_and_setting`), or None.
    sha256: the file's SHA-256 hex digest.
    mismatches: how `setting` differs from the run's (`setting_mismatches`); empty without a run.
  """
  strategy: base.Strategy
  setting: Optional[dict]
  sha256: str
  mismatches: Tuple[str, ...] = ()


def read_strategy_file(path, run: Optional[participation_lib.RunSetting] = None) -> StrategyFile:
  """The strategy file at `path`, its digest and how its setting differs from the `run`'s (None:
  not compared).

  Raises:
    ValueError: a `run` that is not a `RunSetting`, or a file that cannot be read as a strategy.
  """
  if run is not None:
    run = _check_run(run)
  document = _read_document(path)
  sha256 = file_sha256(path)
  setting = _document_setting(document)
  mismatches = () if run is None or setting is None else _mismatches(setting, run)
  return StrategyFile(_document_strategy(document), setting, sha256, mismatches)
