"""The mechanism registry: one entry per mechanism name, the only place that maps a name to code.

Every layer that needs to go from a mechanism name to behaviour asks this module: strategy files and
configs (`strategy_from_config`), the CLIs and drivers (`names`, `default_strategy`, `optimizer`), the
accountant (through the `Strategy` methods) and the aggregators (`noise_class`, the TensorFlow
streaming noise, imported only when asked for, so this module stays TensorFlow-free).

Names: 'gaussian' (DP-SGD / DP-FedAvg, C = I), 'tree' (vanilla tree aggregation), 'tree_efficient'
(Honaker's efficient tree), 'tree_full' (TreeAgg-Full, offline, accounting only), 'banded' (BandMF),
'blt' (Buffered Linear Toeplitz), 'bsr' (banded square root) and 'bisr' (banded inverse square
root), the closed forms whose registered 'optimizer' only builds them for a setting. See
docs/papers.md for the papers behind each.
"""

import dataclasses
import importlib
from typing import Callable, Optional, Tuple

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import base


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """A registered mechanism.

  Attributes:
    name: the mechanism name used in configs, files, flags and reports.
    strategy_class: 'module:Class' of its `base.Strategy`.
    noise_class: 'module:Class' of its `dp_ftrl_tff.noise` streaming state, or None when the
      strategy cannot stream (TreeAgg-Full decodes offline).
    default_config: the config of the parameter-free strategy, or None when parameters are needed
      (a strategy file or an optimizer).
    optimizer: 'module:function' optimizing the strategy for a setting (or building a closed form
      for it), or None. It is called with the keywords num_rounds, participation, the
      `optimizer_options` values, and error when `default_error` is set.
    optimizer_options: the optimizer's optional keyword arguments that the CLIs expose as flags of
      the same names (None leaves the optimizer's default), e.g. the BLT's 'num_buffers'.
    default_error: the loss the optimizer minimizes by default ('max' or 'rms'); None when it
      minimizes nothing (closed forms).
    parameter_options: option names that give the strategy's parameters directly (the BLT's
      'theta' and 'omega', lists of floats; the closed forms' 'num_bands', an int), instead of a
      strategy file.
    file_suffix: the strategy file format `files.save_strategy` needs ('.json' or '.npz').
  """
  name: str
  strategy_class: str
  noise_class: Optional[str]
  default_config: Optional[dict] = None
  optimizer: Optional[str] = None
  optimizer_options: Tuple[str, ...] = ()
  default_error: Optional[str] = None
  parameter_options: Tuple[str, ...] = ()
  file_suffix: str = '.json'

  @property
  def needs_parameters(self) -> bool:
    """True when the strategy comes from a file or an optimizer (no parameter-free default)."""
    return self.default_config is None

  @property
  def streams(self) -> bool:
    """True when the strategy has a streaming noise state (usable in an aggregator)."""
    return self.noise_class is not None


def _tree(name: str) -> Mechanism:
  return Mechanism(name, 'dp_ftrl_tff.mechanisms.tree:TreeStrategy',
                   None if name == 'tree_full' else 'dp_ftrl_tff.noise.tree:TreeNoise',
                   default_config={'mechanism': name})


def _square_root(name: str, strategy_class: str, noise_class: str) -> Mechanism:
  return Mechanism(name, f'dp_ftrl_tff.mechanisms.square_root:{strategy_class}', noise_class,
                   optimizer=f'dp_ftrl_tff.mechanisms.square_root:{name}_for_setting',
                   optimizer_options=('num_bands',), parameter_options=('num_bands',))


_REGISTRY = {m.name: m for m in (
    Mechanism('gaussian', 'dp_ftrl_tff.mechanisms.gaussian:GaussianStrategy',
              'dp_ftrl_tff.noise.gaussian:GaussianNoise', default_config={'mechanism': 'gaussian'}),
    _tree('tree'),
    _tree('tree_efficient'),
    _tree('tree_full'),
    Mechanism('banded', 'dp_ftrl_tff.mechanisms.banded:BandedStrategy',
              'dp_ftrl_tff.noise.banded:BandedNoise',
              optimizer='dp_ftrl_tff.mechanisms.banded:optimize_banded',
              optimizer_options=('num_bands',), default_error='rms', file_suffix='.npz'),
    Mechanism('blt', 'dp_ftrl_tff.mechanisms.blt:BLTStrategy', 'dp_ftrl_tff.noise.blt:BLTNoise',
              optimizer='dp_ftrl_tff.mechanisms.blt:optimize_blt',
              optimizer_options=('num_buffers',), default_error='max',
              parameter_options=('theta', 'omega')),
    _square_root('bsr', 'BandedSquareRootStrategy', 'dp_ftrl_tff.noise.banded:BandedNoise'),
    _square_root('bisr', 'BandedInverseSquareRootStrategy',
                 'dp_ftrl_tff.noise.moving_average:MovingAverageNoise'),
)}


def names(streaming_only: bool = False) -> Tuple[str, ...]:
  """The registered mechanism names (only those with a streaming noise state if asked)."""
  return tuple(name for name, m in _REGISTRY.items() if m.streams or not streaming_only)


def get(name: str) -> Mechanism:
  """The registry entry of `name`; ValueError naming the accepted names otherwise."""
  _validation.check_one_of(name, 'mechanism', tuple(_REGISTRY))
  return _REGISTRY[name]


def _load(path: str):
  module_name, attribute = path.split(':')
  return getattr(importlib.import_module(module_name), attribute)


def strategy_class(name: str) -> type:
  """The `Strategy` subclass of mechanism `name`."""
  return _load(get(name).strategy_class)


def strategy_from_config(config: dict) -> base.Strategy:
  """Builds a strategy from a config dict (`Strategy.to_config()`), dispatching on 'mechanism'.

  The class's `from_config` validates the remaining entries.
  """
  if not isinstance(config, dict):
    raise ValueError(f'`config` must be a dict, got {type(config).__name__}.')
  if 'mechanism' not in config:
    raise ValueError('`mechanism` is missing from the strategy config.')
  return strategy_class(config['mechanism']).from_config(config)


def default_strategy(name: str) -> base.Strategy:
  """The parameter-free strategy of `name` ('gaussian' and the trees); ValueError for the others."""
  mechanism = get(name)
  if mechanism.needs_parameters:
    raise ValueError(f'`mechanism`={name!r} needs parameters: a strategy file or an optimizer.')
  return strategy_from_config(dict(mechanism.default_config))


def optimizer(name: str) -> Callable[..., base.OptimizationResult]:
  """The optimizer of `name` ('banded': `optimize_banded`, 'blt': `optimize_blt`; 'bsr' and
  'bisr': their closed forms for a setting)."""
  mechanism = get(name)
  if mechanism.optimizer is None:
    raise ValueError(f'`mechanism`={name!r} has no optimizer; optimizable: {list(optimizable())}.')
  return _load(mechanism.optimizer)


def optimizable() -> Tuple[str, ...]:
  """The names of the mechanisms with an optimizer."""
  return tuple(name for name, m in _REGISTRY.items() if m.optimizer is not None)


def noise_class(name: str) -> type:
  """The `dp_ftrl_tff.noise` StreamingNoise class of `name` (imports TensorFlow)."""
  mechanism = get(name)
  if not mechanism.streams:
    raise ValueError(f'`mechanism`={name!r} has no streaming noise (it decodes offline); streaming '
                     f'mechanisms: {list(names(streaming_only=True))}.')
  return _load(mechanism.noise_class)
