"""TensorBoard HParams summaries of a finished run, so that TensorBoard's HParams tab compares runs.

At completion a driver writes into its run's `tensorboard/` directory (beside the per-round scalars
of `tff.program.TensorBoardReleaseManager`) with the TensorBoard HParams plugin's API
(`tensorboard.plugins.hparams.api.hparams`):
  * the session's hyperparameters: every setting of `hparams.json` (the driver's own settings as
    `task/<name>`; unset optional settings, null in the file, are left out), plus the accounted
    `noise_multiplier` under `accounted_noise_multiplier`;
  * the final metrics as scalars `final/<metric>` at step n (rounds): the last round's metrics and
    `final/epsilon` (absent without noise), which the HParams tab lists as metric columns.
`tensorboard --logdir=<root_output_dir>` then shows one session per run directory. No experiment
config (`hparams_config`) is written: TensorBoard infers the hyperparameters and metrics from the
sessions, so runs of different drivers under one root still compare.
"""

import json
import os
from typing import Any, Dict, Optional

import tensorflow as tf
from tensorboard.plugins.hparams import api as hp

TENSORBOARD_DIR = 'tensorboard'
FINAL_PREFIX = 'final/'


def flat_hparams(hparams: Dict[str, Any], accounted_noise_multiplier: Optional[float] = None
                 ) -> Dict[str, Any]:
  """The HParams-tab values of a run's `hparams.json` document: nested dicts flattened to `a/b`,
  None left out, lists as their JSON text (the plugin takes bool, int, float and str only)."""
  if not isinstance(hparams, dict):
    raise ValueError(f'`hparams` must be a dict, got {type(hparams).__name__}.')
  flat = {}

  def visit(prefix, value):
    if isinstance(value, dict):
      for key, item in value.items():
        visit(f'{prefix}{key}/', item)
    elif value is None:
      return
    elif isinstance(value, (bool, int, float, str)):
      flat[prefix[:-1]] = value
    else:
      flat[prefix[:-1]] = json.dumps(value)

  visit('', hparams)
  if accounted_noise_multiplier is not None:
    flat['accounted_noise_multiplier'] = float(accounted_noise_multiplier)
  return flat


def write_hparams_summary(output_dir: str, summary: Dict[str, Any]) -> str:
  """Writes the HParams session and the `final/*` scalars of a run from its `summary` document
  (`experiments.run.run_summary`) into `<output_dir>/tensorboard/`; returns that directory."""
  for key in ('hparams', 'final_metrics', 'rounds', 'noise_multiplier'):
    if key not in summary:
      raise ValueError(f'`summary` lacks {key!r} (expected an experiments.run.run_summary document).')
  logdir = os.path.join(os.fspath(output_dir), TENSORBOARD_DIR)
  finals = {name: value for name, value in summary['final_metrics'].items() if value is not None}
  if summary.get('epsilon') is not None:
    finals['epsilon'] = summary['epsilon']
  writer = tf.summary.create_file_writer(logdir)
  try:
    with writer.as_default():
      hp.hparams(flat_hparams(summary['hparams'], summary['noise_multiplier']),
                 trial_id=os.path.basename(os.path.normpath(output_dir)))
      for name, value in sorted(finals.items()):
        tf.summary.scalar(FINAL_PREFIX + name, float(value), step=int(summary['rounds']))
    writer.flush()
  finally:
    writer.close()
  return logdir
