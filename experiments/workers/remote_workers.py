"""The TFF workers of a driver run (`--workers`) and the retry of a computation that lost one."""

from typing import Optional

from absl import logging

from dp_ftrl_tff.learning import remote_execution


class RemoteWorkers:
  """The TFF workers of a run (`--workers`) and the retry of a computation that lost one.

  A round's output depends only on its input state and data (the noise comes from the seeded noise
  state), so re-running a round whose worker died gives the same round on the workers that still
  answer; the sums are merged in another order, so values agree within float32 rounding.
  """

  def __init__(self, addresses: Optional[str]):
    """Args: addresses: 'host:port,...' of the workers, or None (a local run: no retry)."""
    self.addresses = () if addresses is None else remote_execution.parse_worker_addresses(addresses)

  def run(self, what: str, fn, *args):
    """`fn(*args)`; when a worker is lost, again on the others (the TFF context is rebuilt).

    Raises:
      remote_execution.WorkerUnavailableError: no worker answers any more.
    """
    for _ in range(len(self.addresses) + 1):
      try:
        return fn(*args)
      except Exception as error:  # pylint: disable=broad-except
        if not self.addresses or not remote_execution.is_worker_failure(error):
          raise
        alive = remote_execution.responsive_workers(self.addresses)
        lost = [a for a in self.addresses if a not in alive]
        if not alive:
          raise remote_execution.WorkerUnavailableError(
              f'{what} failed: no TFF worker of {",".join(self.addresses)} answers; restart them '
              '(python -m experiments.workers start) and rerun the same command to resume from the '
              'last checkpoint.') from error
        logging.warning('%s: TFF worker(s) %s stopped answering; running it again on %s.', what,
                        ', '.join(lost) or '(none; a transient failure)', ', '.join(alive))
        self.addresses = remote_execution.set_remote_execution_context(alive)
    raise remote_execution.WorkerUnavailableError(
        f'{what} failed on the TFF workers {",".join(self.addresses)} after '
        f'{len(self.addresses) + 1} attempts; check them and rerun the same command to resume.')
