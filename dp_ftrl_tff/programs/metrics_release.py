"""Releases `train_model`'s per-round metrics as the rows of a run's metrics.csv.

`tff.learning.programs.train_model` releases each round's metrics to its `train_metrics_manager`
as a nested structure (`model_metrics/<m>` for the clients' training metrics, `aggregator/<m>` for
the aggregator's measurements: the clip, clipped and zeroed counts, the noise std, the segment and,
with SecAgg, the `modular_wrap` flag and scale factor) keyed by its 1-based round number, as a
background task. `RoundMetricsReleaseManager` turns that into the rows (`train_<m>` and
`aggregator/<m>`, numeric scalars only; `round_metrics`) and releases them to the managers it wraps
(e.g. `tff.program.CSVFileReleaseManager(RUN/metrics.csv, key_fieldname='round')` and a
`TensorBoardReleaseManager`) keyed by the 0-based round, one round at a time in the order the
releases were started, as the privacy report reads them (`accounting.run_metrics`). Managers in `after_metrics` (the report release)
get train_model's value and key once the round's row is written.

A process over client ids (`programs.client_ids`) also reports `cohort_size`, the number of clients
of the round, which the rows keep. A round without training examples (an empty Poisson cohort) has
NaN training metrics (`blank_untrained`).
"""

import asyncio
from collections.abc import Mapping, Sequence
from typing import Dict

import numpy as np
import tensorflow_federated as tff

from dp_ftrl_tff.programs import client_ids

#: The prefix of the clients' training metrics in the rows (`train_loss`, ...).
TRAIN_PREFIX = 'train_'
#: The prefix of the aggregator's measurements in the rows (`aggregator/clip`, ...).
AGGREGATOR_PREFIX = 'aggregator/'


def _scalar(value):
  """`value` as a float when it is a numeric scalar, else None."""
  value = np.asarray(value)
  if value.shape == () and np.issubdtype(value.dtype, np.number):
    return float(value)
  return None


def round_metrics(metrics: Mapping) -> Dict[str, float]:
  """One round's flat metrics under the rows' names.

  Args:
    metrics: `train_model`'s released structure: `model_metrics` (the clients' training metrics,
      `client_work/train` of the process's metrics), `aggregator` (its measurements) and, from a
      process over client ids, `cohort_size`; other entries (`distributor`, `finalizer`, the rest
      of `client_work`) are left out.

  Returns:
    {'train_<m>': float} for every training metric, {'aggregator/<name>': float} for every numeric
    scalar measurement (nested names joined with '/') and {'cohort_size': float}, in that order.

  Raises:
    ValueError: `metrics` is not a mapping with `model_metrics` and `aggregator`, or a training
      metric is not a numeric scalar.
  """
  if not isinstance(metrics, Mapping) or 'model_metrics' not in metrics or \
      'aggregator' not in metrics:
    raise ValueError('`metrics` must be train_model\'s metrics structure, a mapping with '
                     f'`model_metrics` and `aggregator`, got {type(metrics).__name__}.')
  values = {}
  for name, value in tff.program.structure_utils.flatten_with_name(metrics['model_metrics']):
    scalar = _scalar(value)
    if scalar is None:
      raise ValueError(f'`metrics`: model_metrics/{name} is not a numeric scalar.')
    values[TRAIN_PREFIX + name] = scalar
  for name, value in tff.program.structure_utils.flatten_with_name(metrics['aggregator']):
    scalar = _scalar(value)
    if scalar is not None:  # the rows keep numeric scalars only (not canary projections)
      values[AGGREGATOR_PREFIX + name] = scalar
  if client_ids.COHORT_SIZE in metrics:
    values[client_ids.COHORT_SIZE] = float(metrics[client_ids.COHORT_SIZE])
  return values


def blank_untrained(row: Dict[str, float]) -> Dict[str, float]:
  """`row` with its `train_<m>` metrics (bar the `train_num_<m>` counts) set to NaN when the round
  trained on no example (`train_num_examples` is 0, e.g. an empty Poisson cohort): TFF reports 0
  for a mean over no examples, which would read as a loss of 0.
  """
  if row.get(TRAIN_PREFIX + 'num_examples', 1.0) != 0:
    return row
  return {name: (float('nan') if name.startswith(TRAIN_PREFIX) and
                 not name.startswith(TRAIN_PREFIX + 'num_') else value)
          for name, value in row.items()}


class RoundMetricsReleaseManager(tff.program.ReleaseManager):
  """A `train_metrics_manager` for `train_model` that releases the metric rows.

  `release(value, key)` takes train_model's metrics structure and its 1-based round number `key`
  (rounds done), and releases `round_metrics(value)` to each of `managers` in turn with the 0-based
  round `key - 1`, then `value` with `key` unchanged to each of `after_metrics`. Releases run one at
  a time in the order they were started (train_model starts one background task per round, in
  round order; without the lock two rounds' CSV read-rewrites could interleave).
  """

  def __init__(self, managers: Sequence[tff.program.ReleaseManager], *,
               after_metrics: Sequence[tff.program.ReleaseManager] = ()):
    """Args:
      managers: the managers of the flat rows (0-based `round` key), e.g. a CSV and a TensorBoard
        release manager.
      after_metrics: managers released after the round's rows with train_model's value and 1-based
        key, e.g. a `report_release.PrivacyReportReleaseManager` that reads the metrics CSV.

    Raises:
      ValueError: naming the parameter, when it is not a sequence of `tff.program.ReleaseManager`.
    """
    self._managers = self._check(managers, 'managers')
    self._after = self._check(after_metrics, 'after_metrics')
    self._lock = asyncio.Lock()

  @staticmethod
  def _check(managers, name):
    if isinstance(managers, (str, bytes)) or not isinstance(managers, Sequence) or any(
        not isinstance(m, tff.program.ReleaseManager) for m in managers):
      raise ValueError(f'`{name}` must be a sequence of tff.program.ReleaseManager, got '
                       f'{managers!r}.')
    return tuple(managers)

  async def release(self, value, key: int) -> None:
    """Releases round `key`'s (1-based, train_model's) metrics `value`; see the class docstring.

    Raises:
      ValueError: `key` is not an int >= 1, or `value` is not train_model's metrics structure.
    """
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)) or key < 1:
      raise ValueError(f'`key` must be train_model\'s 1-based round number, got {key!r}.')
    row = blank_untrained(round_metrics(value))
    # Acquiring a free asyncio.Lock does not yield, and waiters are served first in, first out: the
    # releases run in the order their tasks started.
    async with self._lock:
      for manager in self._managers:
        await manager.release(row, key=int(key) - 1)
      for manager in self._after:
        await manager.release(value, key=int(key))
