"""TFF execution contexts over remote workers, synchronous and asynchronous, that survive a lost one.

Both are built once, here, from TFF's executors (`dp_ftrl_tff.learning.remote_execution` documents
the design and holds the workers' addresses, availability checks and failures; this module's
`create_remote_execution_context`, `create_async_remote_execution_context` and
`set_remote_execution_context` create and install the contexts):
  * per worker: a `RemoteExecutor` over the worker's gRPC stub (failing fast when the worker is gone)
    in a `ResourceManagingExecutorFactory` and an `AsyncExecutionContext` with TFF's native
    compiler, as TFF's own local C++ context is composed;
  * over the workers: TFF's `MergeableCompExecutionContext`, which splits a call's clients across
    them, merges their partial aggregates and runs the server part once.

`RemoteExecutionContext` is a synchronous TFF context (the drivers' `--workers`, a user's plain loop
over `process.next`): it wraps the mergeable context and retries a call that lost a worker.
`AsyncRemoteExecutionContext` is the asynchronous one `tff.program.NativeFederatedContext` and
`tff.learning.programs.train_model` need: each call runs the synchronous context's `invoke` (retry
included) in a thread and awaits it. A thread, not the caller's event loop: TFF 0.87's
`RemoteExecutor` makes blocking gRPC calls, so run on the program's loop a round would stall the
program's other tasks (its releases and checkpoint saves) until it ends.

The retry: a call that fails with a worker failure (`remote_execution.is_worker_failure`) runs again,
whole, on the workers that still answer (the mergeable context is rebuilt over them; a lost worker is
not used again), up to one more time than there were workers. A call's output depends only on its
arguments (the noise comes from the seeded noise state in the process's state), so the rerun gives
the same output within float32 rounding of the merged sums. When no worker answers any more the call
raises `remote_execution.WorkersLostError`.
"""

import asyncio
import threading
from typing import Sequence, Tuple, Union

import tensorflow_federated as tff
from absl import logging
from tensorflow_federated.python.core.backends.native import compiler as native_compiler
from tensorflow_federated.python.core.backends.native import execution_contexts
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
  tensorflow_computation,
)
from tensorflow_federated.python.core.impl.context_stack import context_base
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import (
  executors_errors,
  remote_executor,
  remote_executor_grpc_stub,
)

from dp_ftrl_tff.learning import remote_execution

# How long a worker whose call failed may take to accept a new connection before it counts as gone.
_RECONNECT_SECONDS = 5.0


class _FailFastStub:
  """The gRPC stub of one worker, failing fast when the worker is gone.

  TFF's asynchronous context retries a call that failed with UNAVAILABLE forever (every 30 s), so a
  dead worker would hang the round. A retryable failure is re-raised as TFF's retryable error only
  while the worker still accepts connections (a transient failure); otherwise it becomes a
  `WorkerUnavailableError` naming the address, which TFF does not retry.
  """

  def __init__(self, stub, address: str):
    self._stub = stub
    self._address = address

  def __getattr__(self, name):
    attribute = getattr(self._stub, name)
    if not callable(attribute):
      return attribute

    def call(*args, **kwargs):
      try:
        return attribute(*args, **kwargs)
      except executors_errors.RetryableGRPCError as error:
        if remote_execution.worker_answers(self._address, _RECONNECT_SECONDS):
          raise
        raise remote_execution.WorkerUnavailableError(
            f'TFF worker {self._address} stopped answering.') from error

    return call


def _worker_context(address: str) -> async_execution_context.AsyncExecutionContext:
  """An asynchronous TFF context running every computation on the worker at `address`.

  TFF 0.87 exports neither the remote executor, its gRPC stub, nor the executor factory and context
  classes that compose them; these are the modules TFF's own local C++ context is built from.
  """
  stub = _FailFastStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub(
      remote_execution.channel(address)), address)

  def executor_fn(cardinalities):
    # A computation without a CLIENTS argument (e.g. the server step) has no clients.
    cardinalities.setdefault(tff.CLIENTS, 0)
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return async_execution_context.AsyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(executor_fn),
      compiler_fn=native_compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


def _mergeable_context(addresses: Sequence[str]):
  return execution_contexts.create_mergeable_comp_execution_context(
      [_worker_context(address) for address in addresses])


class RemoteExecutionContext(context_base.SyncContext):
  """TFF's mergeable context over the workers at `addresses`, retrying a call that lost a worker
  (see the module docstring). `addresses` holds the workers still in use."""

  def __init__(self, addresses: Union[str, Sequence[str]]):
    self._addresses = remote_execution.parse_worker_addresses(addresses)
    self._lock = threading.Lock()  # calls may come from several threads (the asynchronous context)
    self._context = _mergeable_context(self._addresses)

  @property
  def addresses(self) -> Tuple[str, ...]:
    return self._addresses

  def invoke(self, comp, arg):
    attempts = len(self._addresses) + 1
    for _ in range(attempts):
      context = self._context
      try:
        return context.invoke(comp, arg)
      except Exception as error:  # pylint: disable=broad-except
        if not remote_execution.is_worker_failure(error):
          raise
        self._drop_lost_workers(context, error)
    raise remote_execution.WorkerUnavailableError(
        f'a computation failed on the TFF workers {",".join(self._addresses)} {attempts} times; '
        'check them.')

  def _drop_lost_workers(self, failed, error: BaseException) -> None:
    """Rebuilds the mergeable context over the workers that answer, unless a call in another
    thread already rebuilt it since `failed` was current.

    Raises:
      remote_execution.WorkersLostError: no worker answers.
    """
    with self._lock:
      if self._context is not failed:
        return
      alive = remote_execution.responsive_workers(self._addresses)
      if not alive:
        raise remote_execution.WorkersLostError(
            f'no TFF worker of {",".join(self._addresses)} answers') from error
      lost = [address for address in self._addresses if address not in alive]
      logging.warning('TFF worker(s) %s stopped answering; running it again on %s.',
                      ', '.join(lost) or '(none; a transient failure)', ', '.join(alive))
      self._addresses = alive
      self._context = _mergeable_context(alive)


class AsyncRemoteExecutionContext(context_base.AsyncContext):
  """`RemoteExecutionContext` (its workers, its retry) as an asynchronous TFF context: for
  `tff.program.NativeFederatedContext` and `tff.learning.programs.train_model`."""

  def __init__(self, addresses: Union[str, Sequence[str]]):
    self._sync = RemoteExecutionContext(addresses)

  @property
  def addresses(self) -> Tuple[str, ...]:
    return self._sync.addresses

  async def invoke(self, comp, arg):
    if asyncio.iscoroutine(arg):  # as TFF's asynchronous context: a pending argument is awaited
      arg = await arg
    return await asyncio.to_thread(self._sync.invoke, comp, arg)


def create_remote_execution_context(addresses: Union[str, Sequence[str]]):
  """A synchronous TFF context over the workers at `addresses`, not installed (see the module doc).

  TFF's mergeable context (`remote_contexts.RemoteExecutionContext`): each call of a federated
  computation splits its clients into one group per worker (in order, as equal as possible), runs
  the groups in parallel, merges their partial aggregates and runs the server part once; a call that
  lost a worker runs again on the workers that still answer.
  """
  return RemoteExecutionContext(addresses)


def create_async_remote_execution_context(addresses: Union[str, Sequence[str]]):
  """`create_remote_execution_context` as an asynchronous TFF context (the same workers, merge and
  retry), for TFF's program platform: `tff.program.NativeFederatedContext(<this>)`, installed before
  `tff.learning.programs.train_model` runs.

      remote_execution.wait_for_workers(addresses)
      context = tff.program.NativeFederatedContext(
          remote_contexts.create_async_remote_execution_context(addresses))
      with tff.framework.get_context_stack().install(context):
        asyncio.run(tff.learning.programs.train_model(...))
  """
  return AsyncRemoteExecutionContext(addresses)


def set_remote_execution_context(addresses: Union[str, Sequence[str]], *,
                                 timeout_seconds: float = 30.0) -> Tuple[str, ...]:
  """Waits for the workers at `addresses`, then makes them TFF's default execution context.

  Call it once, before the first TFF computation runs (TFF's import-time local context must not
  have run anything: replacing it later can hang on its worker's exit). Use it with a user's own TFF loop as with the drivers'
  `--workers`:

      set_remote_execution_context('10.0.0.2:8000,10.0.0.3:8000')
      process = tff.learning.algorithms.build_unweighted_fed_avg(..., model_aggregator=factory)

  Returns:
    The worker addresses, parsed.

  Raises:
    ValueError: malformed `addresses`.
    remote_execution.WorkerUnavailableError: a worker did not answer within `timeout_seconds`.
  """
  addresses = remote_execution.parse_worker_addresses(addresses)
  remote_execution.wait_for_workers(addresses, timeout_seconds)
  tff.framework.get_context_stack().set_default_context(create_remote_execution_context(addresses))
  return addresses
