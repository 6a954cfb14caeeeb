"""The TFF workers of a driver run (`--workers`): a computation that failed on them, named."""

from typing import Optional

from dp_ftrl_tff.learning import remote_execution


class RemoteWorkers:
  """The TFF workers of a run (`--workers`).

  The retry of a computation that lost a worker is the remote context's own
  (`dp_ftrl_tff.learning.remote_contexts`, shared with the train_model program): it runs the call
  again on the workers that still answer. What reaches here is a call that failed on every worker;
  `run` names it (`round 2 failed: no TFF worker of ... answers`) and the binaries' one-line error
  (`experiments.run.driver`) says how to resume.
  """

  def __init__(self, addresses: Optional[str]):
    """Args: addresses: 'host:port,...' of the workers, or None (a local run)."""
    self.addresses = () if addresses is None else remote_execution.parse_worker_addresses(addresses)

  def run(self, what: str, fn, *args):
    """`fn(*args)`; a failure of the workers is raised again with `what` in its message.

    Raises:
      remote_execution.WorkerUnavailableError (a `WorkersLostError` when no worker answers any
        more): the message starts with `<what> failed: `.
    """
    try:
      return fn(*args)
    except remote_execution.WorkerUnavailableError as error:
      if not self.addresses:
        raise
      raise type(error)(f'{what} failed: {error}') from error
