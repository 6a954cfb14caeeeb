"""The mechanism registry: one entry per mechanism name, the only place that maps a name to facts.

An entry (`Mechanism`) holds everything that is particular to one mechanism: its strategy class and
streaming noise class, its parameter-free default, its optimizer with the options it takes (name,
type, default, help text), the options that give its parameters directly, its memory model, its
strategy file format, its reference strategy for a planned run and its rows in the equal-privacy
comparison. The flags of the binaries, the CLI help, the memory checks, the strategy resolver
(`mechanisms.resolve`), the accountant and the aggregators all derive from the entry; an unknown
name is an error everywhere. Classes and functions are named as 'module:attribute' and imported
only when asked for, so this module imports no TensorFlow.

Built-in names: 'gaussian' (DP-SGD / DP-FedAvg, C = I), 'tree' (vanilla tree aggregation),
'tree_efficient' (Honaker's efficient tree), 'tree_full' (TreeAgg-Full, offline, accounting only),
'banded' (BandMF), 'blt' (Buffered Linear Toeplitz), 'bsr' (banded square root) and 'bisr' (banded
inverse square root), the closed forms whose registered optimizer only builds them for a setting.
See docs/papers.md for the papers behind each. `register` adds a mechanism of one's own.
"""

import dataclasses
import importlib
from typing import Any, Callable, Dict, Optional, Tuple

from dp_ftrl_tff import _registry, _validation
from dp_ftrl_tff.mechanisms import base

OPTION_KINDS = ('int', 'floats', 'bool', 'choice')
FILE_SUFFIXES = ('.json', '.npz')


@dataclasses.dataclass(frozen=True)
class Option:
  """An option of a mechanism's optimizer, or one of its parameters given directly.

  The binaries define one flag per option name (`--<name>`), shared by every mechanism that has
  an option of that name; the name is also the optimizer's keyword, or the key in the strategy's
  config for a parameter.

  Attributes:
    name: the keyword / config key / flag name, e.g. 'num_bands'.
    kind: 'int' (>= 1), 'floats' (a list of real numbers), 'bool' or 'choice' (one of `choices`).
    help: what it sets, with its unit and default, for the flag's help text.
    default: the value when the option is not given (None: the optimizer's own default).
    choices: the accepted values of a 'choice' option.
  """
  name: str
  kind: str
  help: str
  default: Any = None
  choices: Tuple[str, ...] = ()

  def __post_init__(self):
    _validation.check_one_of(self.kind, 'kind', OPTION_KINDS)
    if (self.kind == 'choice') != bool(self.choices):
      raise ValueError(f'`choices` must be given exactly for kind=choice (option {self.name!r}).')


def _no_vectors(strategy, num_rounds: int) -> int:
  del strategy, num_rounds
  return 0


@dataclasses.dataclass(frozen=True)
class MemoryModel:
  """Bytes the float64 arrays of a mechanism's computation over n rounds need at least:
  quadratic * n^2 + linear * n (measured with tracemalloc; a lower bound), and the model-sized
  vectors its streaming noise state holds (`memory.check_noise_state_fits`).

  Attributes:
    losses: (bytes per n^2, bytes per n) to evaluate losses or optimize.
    sensitivity: (bytes per n^2, bytes per n) of the sensitivity alone (accounting).
    noise_vectors: (strategy, n) -> the model-sized vectors of its streaming noise state, at most,
      over n rounds (noise/ documents each state; `experiments.benchmarks.noise_memory_bench`
      measures them).
    noise_option: the option or setting that sets that number, as errors name it ('num_buffers').
  """
  losses: Tuple[int, int] = (0, 0)
  sensitivity: Tuple[int, int] = (0, 0)
  noise_vectors: Callable[[base.Strategy, int], int] = _no_vectors
  noise_option: str = 'num_rounds'


@dataclasses.dataclass(frozen=True)
class Comparison:
  """One row of the equal-privacy comparison (`accounting.equal_privacy`).

  Attributes:
    label: the row's name; `{option}` fields are filled from the strategy (e.g. '{num_bands}').
    options: optimizer options of the row (options left out that the run's own strategy of this
      mechanism has are taken from it, e.g. the run's number of bands).
    source: how the row's source reads; '{source}' is how the strategy was obtained (e.g.
      'optimized on the spot for max loss').
    max_rounds: the row is skipped above this many rounds, or None.
    cost: why, e.g. 'its losses cost O(n^3)'.
  """
  label: str
  options: Dict[str, Any] = dataclasses.field(default_factory=dict)
  source: str = '{source}'
  max_rounds: Optional[int] = None
  cost: str = ''


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """A registered mechanism; see the module docstring.

  Attributes:
    name: the mechanism name used in configs, files, flags and reports.
    summary: a few words for the `--mechanism` help, e.g. 'BandMF (banded matrix factorization)'.
    strategy_class: 'module:Class' of its `base.Strategy`.
    noise_class: 'module:Class' of its `dp_ftrl_tff.noise` streaming state, or None when the
      strategy cannot stream (TreeAgg-Full decodes offline).
    default_config: the config of the parameter-free strategy, or None when parameters are needed
      (a strategy file, parameter options or the optimizer).
    optimizer: 'module:function' optimizing the strategy for a setting (or building a closed form
      for it), or None. It is called with the keywords num_rounds, participation and the
      `optimizer_options` values.
    optimizer_options: the optimizer's options (`Option`), e.g. the BLT's 'num_buffers'.
    parameter_options: options that give the strategy's parameters directly instead of a file (the
      BLT's 'theta' and 'omega', the closed forms' 'num_bands', the trees' 'completion'); their
      names are keys of the strategy's config.
    file_suffix: the strategy file format `files.save_strategy` writes ('.json' or '.npz').
    memory: the `MemoryModel` of its float64 arrays.
    reference_strategy: 'module:attribute' of a published strategy a planned-run report uses when
      no parameters are given (the BLT paper's production BLT), or None.
    comparisons: its rows in the equal-privacy comparison.
  """
  name: str
  summary: str
  strategy_class: str
  noise_class: Optional[str]
  default_config: Optional[dict] = None
  optimizer: Optional[str] = None
  optimizer_options: Tuple[Option, ...] = ()
  parameter_options: Tuple[Option, ...] = ()
  file_suffix: str = '.json'
  memory: MemoryModel = MemoryModel()
  reference_strategy: Optional[str] = None
  comparisons: Tuple[Comparison, ...] = ()

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name.isidentifier():
      raise ValueError(f'`name` must be an identifier, got {self.name!r}.')
    _validation.check_one_of(self.file_suffix, 'file_suffix', FILE_SUFFIXES)
    for option in self.optimizer_options + self.parameter_options:
      if not isinstance(option, Option):
        raise ValueError(f'Options of {self.name!r} must be Option objects, got {option!r}.')
    if self.optimizer_options and self.optimizer is None:
      raise ValueError(f'{self.name!r} has `optimizer_options` but no `optimizer`.')

  @property
  def needs_parameters(self) -> bool:
    """True when the strategy comes from a file, parameter options or an optimizer."""
    return self.default_config is None

  @property
  def streams(self) -> bool:
    """True when the strategy has a streaming noise state (usable in an aggregator)."""
    return self.noise_class is not None

  @property
  def options(self) -> Tuple[Option, ...]:
    """Every option of the mechanism, each name once (parameter options first)."""
    seen = {option.name: option for option in self.optimizer_options}
    seen.update({option.name: option for option in self.parameter_options})
    return tuple(seen.values())

  def option(self, name: str) -> Option:
    """The option `name`; ValueError naming the options of this mechanism otherwise."""
    for option in self.options:
      if option.name == name:
        return option
    raise ValueError(f'`{name}` does not apply to mechanism={self.name} (its options: '
                     f'{[o.name for o in self.options] or "none"}).')

  def build_strategy(self, options: Dict[str, Any], num_rounds: Optional[int],
                     participation, fallback: str
                     ) -> Tuple[base.Strategy, str, Optional[base.OptimizationResult]]:
    """(strategy, source kind, optimizer result or None) from the options given (no file).

    Every option given is the optimizer's, and `fallback` is 'optimize' or an option given is not
    a parameter too: the optimizer's strategy for the setting; else the parameter options (the parameter-free
    default with none); else the `fallback`: 'optimize', 'reference' (`reference_strategy`) or
    'error'. `num_rounds` and `participation` are the checked setting (or None);
    `mechanisms.resolve` is the caller.
    """
    for name in options:
      self.option(name)  # ValueError: the option does not apply to this mechanism
    optimizer_names = {o.name for o in self.optimizer_options}
    parameter_names = {o.name for o in self.parameter_options}
    if self.needs_parameters and self.optimizer is not None and set(options) <= optimizer_names:
      # An option of the optimizer alone asks for the optimizer, whatever the fallback.
      if fallback == 'optimize' or not set(options) <= parameter_names:
        return self._optimized(options, num_rounds, participation)
    parameters = {name: value for name, value in options.items() if name in parameter_names}
    others = sorted(set(options) - parameter_names)
    if others:
      raise ValueError(f'`{others[0]}` does not apply with the parameters of mechanism={self.name}'
                       + (f' (`{"`, `".join(sorted(parameters))}`).' if parameters else '.'))
    if parameters or not self.needs_parameters:
      return self._from_parameters(parameters), 'parameters' if parameters else 'default', None
    if fallback == 'reference' and self.reference_strategy is not None:
      return import_path(self.reference_strategy), 'reference', None
    if fallback != 'optimize' or self.optimizer is None:
      needed = [o.name for o in self.parameter_options]
      raise ValueError(f'mechanism={self.name} needs `mechanism_file`'
                       + (f' or `{"` and `".join(needed)}`.' if needed else '.'))
    return self._optimized({}, num_rounds, participation)

  def _optimized(self, options, num_rounds, participation):
    if num_rounds is None or participation is None:
      raise ValueError(f'mechanism={self.name} needs its parameters, a `mechanism_file`, or the '
                       "run's `rounds` and `min_sep` to optimize for.")
    kwargs = {option.name: options.get(option.name, option.default)
              for option in self.optimizer_options}
    result = import_path(self.optimizer)(num_rounds=num_rounds, participation=participation,
                                         **kwargs)
    return result.strategy, 'optimized', result

  def _from_parameters(self, parameters: Dict[str, Any]) -> base.Strategy:
    """The strategy from its parameter options (the parameter-free default with none)."""
    required = [o.name for o in self.parameter_options if o.default is None]
    missing = [name for name in required if name not in parameters]
    if missing and (parameters or self.needs_parameters):
      raise ValueError(f'`{"` and `".join(required)}` must be given together for '
                       f'mechanism={self.name} (missing `{missing[0]}`).')
    config = dict(self.default_config or {'mechanism': self.name})
    config.update({name: list(value) if isinstance(value, tuple) else value
                   for name, value in parameters.items()})
    try:
      return strategy_from_config(config)
    except ValueError as error:
      raise ValueError(f'`{"`/`".join(sorted(parameters))}`: {error}') from None


def _completion_option() -> Option:
  return Option('completion', 'bool', 'Trees: release the nodes of the tree padded to 2^ceil(log2 '
                'n) leaves (tree completion).', default=False)


def _tree(name: str, summary: str) -> Mechanism:
  full = name == 'tree_full'
  return Mechanism(
      name, summary, 'dp_ftrl_tff.mechanisms.tree:TreeStrategy',
      None if full else 'dp_ftrl_tff.noise.tree:TreeNoise', default_config={'mechanism': name},
      parameter_options=(_completion_option(),),
      memory=MemoryModel(losses=(24, 33) if full else (0, 33), sensitivity=(0, 33),
                         # Honaker's live left siblings: at most floor(log2(n + 1)).
                         noise_vectors=(lambda strategy, n: (n + 1).bit_length() - 1)
                         if name == 'tree_efficient' else _no_vectors),
      # The full tree's losses cost O(n^3): about 3 s at n = 2000, 20 s at n = 4000.
      comparisons=(Comparison(name, max_rounds=2100 if full else None,
                              cost='its losses cost O(n^3)'),))


def _ring_buffer(strategy, num_rounds: int) -> int:
  """A banded stream's ring buffer: the last b-hat - 1 outputs (BandMF, BSR) or draws (BISR)."""
  del num_rounds
  return strategy.num_bands - 1


def _bands_option(what: str) -> Option:
  return Option('num_bands', 'int', f'{what}: bands b-hat (default min(min_sep, rounds)).')


def _error_option(default: str) -> Option:
  return Option('error', 'choice', f'Loss the optimizer minimizes (default {default}).',
                default=default, choices=('max', 'rms'))


def _square_root(name: str, summary: str, strategy_class: str, noise_class: str,
                 memory: MemoryModel) -> Mechanism:
  bands = _bands_option(name)
  return Mechanism(name, summary, f'dp_ftrl_tff.mechanisms.square_root:{strategy_class}',
                   noise_class, optimizer=f'dp_ftrl_tff.mechanisms.square_root:optimize_{name}',
                   optimizer_options=(bands,), parameter_options=(bands,), memory=memory)


_BUILT_IN = (
    Mechanism('gaussian', 'DP-SGD / DP-FedAvg: independent noise (C = I)',
              'dp_ftrl_tff.mechanisms.gaussian:GaussianStrategy',
              'dp_ftrl_tff.noise.gaussian:GaussianNoise', default_config={'mechanism': 'gaussian'},
              comparisons=(Comparison('gaussian'),)),
    _tree('tree', 'vanilla tree aggregation'),
    _tree('tree_efficient', "Honaker's efficient tree aggregation"),
    _tree('tree_full', 'TreeAgg-Full (offline decoder; accounting only)'),
    Mechanism(
        'banded', 'BandMF (banded matrix factorization)',
        'dp_ftrl_tff.mechanisms.banded:BandedStrategy', 'dp_ftrl_tff.noise.banded:BandedNoise',
        optimizer='dp_ftrl_tff.mechanisms.banded_optimizer:optimize_banded',
        optimizer_options=(
            _bands_option('BandMF'), _error_option('rms'),
            Option('toeplitz', 'bool', 'BandMF: optimize a banded Toeplitz C (fast; the general '
                   'optimizer takes minutes at 2000 rounds).', default=False)),
        file_suffix='.npz', memory=MemoryModel(losses=(32, 0), sensitivity=(32, 0),
                                               noise_vectors=_ring_buffer, noise_option='num_bands'),
        comparisons=(Comparison('banded ({num_bands} bands)', {'toeplitz': True},
                                source='banded Toeplitz C {source}; the general BandMF optimizer '
                                'is not run (minutes at n = 2000)'),)),
    Mechanism(
        'blt', 'Buffered Linear Toeplitz', 'dp_ftrl_tff.mechanisms.blt:BLTStrategy',
        'dp_ftrl_tff.noise.blt:BLTNoise', optimizer='dp_ftrl_tff.mechanisms.blt:optimize_blt',
        optimizer_options=(
            Option('num_buffers', 'int', 'BLT: buffers d (default: the optimizer tries 1 to 8 and '
                   'keeps the fewest within 0.05% of the best loss; it optimizes 1 .. d in turn, '
                   'refused when that would not fit in memory or an hour).'),
            _error_option('max')),
        parameter_options=(
            Option('theta', 'floats', 'BLT: buffer decays theta (comma-separated; with --omega).'),
            Option('omega', 'floats', 'BLT: output scales omega (comma-separated; with --theta).')),
        memory=MemoryModel(losses=(0, 56), sensitivity=(0, 56),
                           noise_vectors=lambda strategy, n: strategy.num_buffers,
                           noise_option='num_buffers'),
        reference_strategy='dp_ftrl_tff.mechanisms.blt:REFERENCE_STRATEGY',
        comparisons=tuple(Comparison(f'blt ({d} buffer{"s" if d > 1 else ""})', {'num_buffers': d})
                          for d in range(1, 5))),
    _square_root('bsr', 'banded square root (closed form)', 'BandedSquareRootStrategy',
                 'dp_ftrl_tff.noise.banded:BandedNoise',
                 MemoryModel(losses=(0, 79), sensitivity=(0, 32), noise_vectors=_ring_buffer,
                             noise_option='num_bands')),
    _square_root('bisr', 'banded inverse square root (closed form)',
                 'BandedInverseSquareRootStrategy',
                 'dp_ftrl_tff.noise.moving_average:MovingAverageNoise',
                 MemoryModel(losses=(0, 79), sensitivity=(0, 79), noise_vectors=_ring_buffer,
                             noise_option='num_bands')),
)
_REGISTRY = _registry.Registry('mechanism', Mechanism, 'registry.Mechanism', _BUILT_IN)
#: Removes a mechanism added with `register`; `register` for the duration of a `with` block.
unregister, registered = _REGISTRY.unregister, _REGISTRY.registered
#: Every registered `Mechanism`, in registration order; the entry of one name (ValueError naming
#: `mechanism` and the registered names otherwise).
entries, entry = _REGISTRY.entries, _REGISTRY.entry


def register(mechanism: Mechanism) -> None:
  """Adds `mechanism` to the registry; ValueError if its name is taken or an option it shares
  with another mechanism has another kind (each option name is one flag)."""
  if isinstance(mechanism, Mechanism):
    kinds = {o.name: o.kind for m in entries() for o in m.options}
    for option in mechanism.options:
      if kinds.get(option.name, option.kind) != option.kind:
        raise ValueError(f'Option `{option.name}` of {mechanism.name!r} is a {option.kind}, but '
                         f'another mechanism has it as a {kinds[option.name]}.')
  _REGISTRY.register(mechanism)


def names(streaming_only: bool = False) -> Tuple[str, ...]:
  """The registered mechanism names (only those with a streaming noise state if asked)."""
  return tuple(m.name for m in entries() if m.streams or not streaming_only)


def import_path(path: str) -> Any:
  """The attribute a 'module:attribute' path of an entry names (imported on first use)."""
  module_name, attribute = path.split(':')
  return getattr(importlib.import_module(module_name), attribute)


def strategy_class(name: str) -> type:
  """The `Strategy` subclass of mechanism `name`."""
  return import_path(entry(name).strategy_class)


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
  mechanism = entry(name)
  if mechanism.needs_parameters:
    raise ValueError(f'`mechanism`={name!r} needs parameters: a strategy file or an optimizer.')
  return strategy_from_config(dict(mechanism.default_config))


def optimizer(name: str) -> Callable[..., base.OptimizationResult]:
  """The optimizer of `name` ('banded': `optimize_banded`, 'blt': `optimize_blt`; 'bsr' and
  'bisr': their closed forms for a setting)."""
  mechanism = entry(name)
  if mechanism.optimizer is None:
    raise ValueError(f'`mechanism`={name!r} has no optimizer; optimizable: {list(optimizable())}.')
  return import_path(mechanism.optimizer)


def optimizable() -> Tuple[str, ...]:
  """The names of the mechanisms with an optimizer."""
  return tuple(m.name for m in entries() if m.optimizer is not None)


def noise_class(name: str) -> type:
  """The `dp_ftrl_tff.noise` StreamingNoise class of `name` (imports TensorFlow)."""
  mechanism = entry(name)
  if not mechanism.streams:
    raise ValueError(f'`mechanism`={name!r} has no streaming noise (it decodes offline); streaming '
                     f'mechanisms: {list(names(streaming_only=True))}.')
  return import_path(mechanism.noise_class)


def option_table() -> Dict[str, Tuple[Option, Tuple[str, ...]]]:
  """{option name: (its first `Option`, the mechanisms that have it)} over every mechanism: one flag
  per name."""
  table: Dict[str, Tuple[Option, Tuple[str, ...]]] = {}
  for mechanism in entries():
    for option in mechanism.options:
      first, owners = table.get(option.name, (option, ()))
      table[option.name] = (first, owners + (mechanism.name,))
  return table

