"""A launch-safe training run of one's own model and data: `train(task, config, output_dir)`.

`train` (`training_loop`) runs `tff.learning.programs.train_model` on a `Task` (`task`: the model,
the training `ClientData`, the preprocessing and the evaluation) with the settings of a `RunConfig`
(`run_config`) in a run directory it owns: checks, plan, header, checkpoints with their records
(`checkpoint_records`, `record_checks`), resume, stop signals, the privacy report and the summary,
exactly as the drivers, which are two tasks on it. The names below import their module on first
use, so `import dp_ftrl_tff.training` stays light for binaries that check their flags first.
"""

import importlib

_EXPORTS = {'train': 'training_loop', 'Task': 'task', 'RunConfig': 'run_config'}


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f'{__name__}.{_EXPORTS[name]}'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
