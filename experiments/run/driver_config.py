"""The drivers' run settings: the library's `RunConfig` and what only a driver has (where its run
directory is, which data it loads, how it batches it, its task's own settings).

Every field is the flag of the same name (`driver_flags`); `hparams.json` records them all, and a
resumed run must match them but `dp_ftrl_tff.training.run_config.RESUMABLE_CHANGES` and the run
directory's location.
"""

import dataclasses
import os
from typing import Any, Dict, Optional

from dp_ftrl_tff import _validation
from dp_ftrl_tff.training import run_config

#: The longest directory name of the usual file systems (NAME_MAX of ext4, XFS, tmpfs).
_MAX_NAME_BYTES = 255


@dataclasses.dataclass(frozen=True)
class DriverConfig(run_config.RunConfig):
  """A driver run's settings: `RunConfig`'s, then the run directory
  `<root_output_dir>/<experiment_name>` (`output_dir`), the data (`data`, the synthetic
  population's size), the client batches and epochs, and `task`, the driver's own settings
  ({'model': 'tiny', 'program': 'train_model'})."""
  root_output_dir: Optional[str] = None
  experiment_name: str = 'run'
  data: str = 'synthetic'
  synthetic_num_clients: int = 1000
  synthetic_examples_per_client: int = 20
  client_batch_size: int = 16
  client_epochs: int = 1
  task: Dict[str, Any] = dataclasses.field(default_factory=dict)

  def _check(self) -> None:
    if not isinstance(self.root_output_dir, str) or not self.root_output_dir:
      raise ValueError('`root_output_dir` must be given (--root_output_dir).')
    _check_experiment_name(self.experiment_name)
    for name in ('client_batch_size', 'client_epochs', 'synthetic_num_clients',
                 'synthetic_examples_per_client'):
      _validation.check_positive_int(getattr(self, name), name)
    if not isinstance(self.task, dict):
      raise ValueError(f'`task` must be a dict of the driver\'s settings, got {self.task!r}.')
    super()._check()

  @property
  def output_dir(self) -> str:
    """The run directory."""
    return os.path.join(self.root_output_dir, self.experiment_name)


def _check_experiment_name(name) -> None:
  """One path component: the run directory stays inside `root_output_dir`."""
  if not isinstance(name, str) or not name.strip():
    raise ValueError(f'`experiment_name` must be a non-empty directory name, got {name!r}.')
  if name in ('.', '..') or any(c in name for c in ('/', '\\', '\0')):
    raise ValueError('`experiment_name` must be one directory name inside `root_output_dir` (no '
                     f'"/", "\\" or ".."), got {name!r}.')
  if len(name.encode('utf-8', 'surrogateescape')) > _MAX_NAME_BYTES:
    raise ValueError(f'`experiment_name` is {len(name.encode("utf-8", "surrogateescape"))} bytes '
                     f'long; a directory name has at most {_MAX_NAME_BYTES}.')
