"""The run's progress release: each metrics row with its `round_seconds`, to metrics.csv and
tensorboard/, then the console's round and eval lines and the SecAgg wrap warnings."""

import time

import tensorflow_federated as tff
from absl import logging

from dp_ftrl_tff.training import console, run_config, run_dir


class ProgressRelease(tff.program.ReleaseManager):
  """Adds `round_seconds` (the wall time since the previous row, the first one's since `start()`)
  to each metrics row (0-based key) of a run of `config.rounds` rounds, releases it to `managers`
  (metrics.csv, tensorboard/), then prints the round line with the ETA (`console.round_log_line`)
  and, for a row with an evaluation, the eval line (`console.eval_line`, with the epsilon `plan`
  spent in the rounds so far of the participation log at `log_path`). A round whose secure sum
  wrapped around the field (`modular_wrap` > 0) is logged as a warning and listed in
  `wrap_rounds`."""

  def __init__(self, managers, config: run_config.RunConfig, accuracy_metric: str, plan,
               log_path: str):
    self._managers, self._config, self._accuracy = tuple(managers), config, accuracy_metric
    self._plan, self._log_path = plan, log_path
    self._started = self._last = None
    self._count = 0
    self.wrap_rounds = []

  def start(self) -> None:
    """Starts the clock (before train_model: the first round's time includes its start)."""
    self._started = self._last = time.time()

  async def release(self, value, key):
    config, round_num, num_rounds = self._config, int(key), self._config.rounds
    now = time.time()
    if self._started is None:
      self.start()
    row = {**value, 'round_seconds': now - self._last}
    self._last, self._count = now, self._count + 1
    for manager in self._managers:
      await manager.release(row, key=key)
    if row.get(run_dir.MODULAR_WRAP_METRIC, 0.0) > 0:
      self.wrap_rounds.append(round_num)
      logging.warning('%s', console.modular_wrap_warning(
          round_num, num_rounds, config.secure_bits, config.secure_modclip_prob))
    mean = (now - self._started) / self._count
    console.out(console.round_log_line(
        round_num, num_rounds, row.get('train_loss', float('nan')),
        row.get(f'train_{self._accuracy}', float('nan')), row['round_seconds'],
        mean * (num_rounds - round_num - 1)))
    if any(name.startswith('eval_') for name in row):
      done = round_num + 1
      console.out(console.eval_line(done, num_rounds, row, console.spent_guarantee(
          self._plan, self._log_path, done)))

  def wrap_summary(self, start_round: int) -> None:
    """With SecAgg, after training rounds `start_round`.. (none to train: nothing), the line of the
    rounds whose secure sum wrapped (a warning when one did)."""
    config = self._config
    if not config.secure_aggregation or start_round >= config.rounds:
      return
    (logging.warning if self.wrap_rounds else console.notice)(console.wrap_summary(
        self.wrap_rounds, start_round, config.rounds, config.secure_bits))
