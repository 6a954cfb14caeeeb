"""The mechanisms CLI's commands as plain functions: optimize a strategy, evaluate its losses.

`python -m experiments.mechanisms_cli` parses the flags and calls these. Conventions:
rounds are 0-based; `min_sep` = b (TF-Privacy's min_separation + 1); records print the effective
k = min(k, ceil(n / b)); losses use clip norm 1 and noise multiplier 1 (BLT paper Eq. 9-10,
docs/papers.md#blt).
"""

from typing import Optional

from dp_ftrl_tff.mechanisms import base, files, registry, resolve
from dp_ftrl_tff.mechanisms import participation as participation_lib


def _losses_dict(losses: base.Losses) -> dict:
  return {'max_loss': losses.max_loss, 'rms_loss': losses.rms_loss,
          'sensitivity_squared': losses.sensitivity_squared}


def _setting_dict(mechanism: str, num_rounds: int,
                  participation: participation_lib.ParticipationSchema) -> dict:
  return {'mechanism': mechanism, 'rounds': num_rounds, 'min_sep': participation.min_sep,
          'max_participations': participation.effective_max_participations(num_rounds)}


def optimize(mechanism: str, num_rounds: int,
             participation: participation_lib.ParticipationSchema, *,
             output: Optional[str] = None, **options) -> dict:
  """Optimizes a strategy of an optimizable mechanism (`resolve.resolve_strategy`); returns the
  printed record.

  Args:
    mechanism: a name in `registry.optimizable()`.
    num_rounds, participation: the setting.
    output: save the strategy (and its setting) there.
    **options: the mechanism's optimizer options (`registry.Mechanism.optimizer_options`, e.g.
      num_buffers= and error= for blt, num_bands= for banded); None values are left to the
      optimizer.

  Returns:
    mechanism, rounds, min_sep, max_participations, the strategy's `describe()` entries, max_loss,
    rms_loss, sensitivity_squared, seconds.
  """
  entry = registry.entry(mechanism)
  if entry.optimizer is None:
    raise ValueError(f'`mechanism`={mechanism} has no optimizer; optimizable: '
                     f'{list(registry.optimizable())}.')
  optimizer_options = {option.name for option in entry.optimizer_options}
  for name in options:
    if name not in optimizer_options:
      entry.option(name)  # names the mechanism's options when it has none of that name
      raise ValueError(f'`{name}` does not apply to optimizing {mechanism}.')
  result = resolve.resolve_strategy(mechanism, options=options, num_rounds=num_rounds,
                                    participation=participation).optimization
  record = _setting_dict(mechanism, num_rounds, participation)
  record.update(result.strategy.describe())
  record.update(_losses_dict(result.losses), seconds=result.seconds)
  if output:
    files.save_strategy(result.strategy, output, setting=result)
  return record


def evaluate(strategy: base.Strategy, num_rounds: int,
             participation: participation_lib.ParticipationSchema) -> dict:
  """Losses of `strategy`: mechanism, rounds, min_sep, max_participations, max_loss, rms_loss,
  sensitivity_squared."""
  record = _setting_dict(strategy.name, num_rounds, participation)
  record.update(_losses_dict(strategy.losses(num_rounds, participation)))
  return record


def format_table(record: dict) -> str:
  """A two-column, human-readable rendering of a record."""
  width = max(len(key) for key in record)
  lines = []
  for key, value in record.items():
    if isinstance(value, float):
      text = f'{value:.6g}'
    elif isinstance(value, list):
      text = ', '.join(repr(v) for v in value)
    else:
      text = str(value)
    lines.append(f'{key:<{width}}  {text}')
  return '\n'.join(lines)
