"""Runs TFF computations on TFF's own remote workers: one round's clients split across machines.

TFF ships the engine: the C++ `worker_binary` in the `tensorflow_federated` wheel
(`tensorflow_federated/data/worker_binary --port=P`, insecure gRPC on all interfaces) runs
computations sent to it. TFF's mergeable execution context compiles a federated computation into
"up to merge" work (client work and partial aggregates) that each worker runs on its share of the
clients, a merge of the partial aggregates, and "after merge" work (the server step, e.g. the
correlated noise) that runs once. TFF 0.87's wheel lacks the helpers that connect that context to
remote workers (`cpp_execution_contexts`' remote variants), so this module wires it:
one `RemoteExecutor` per worker address in a `ResourceManagingExecutorFactory` and an
`AsyncExecutionContext` with TFF's native compiler, all of them in a
`MergeableCompExecutionContext` installed as TFF's default context.

Results: the server step runs once, after the merge, so the noise is added once, exactly as in a
local run; the client sums are merged in another order, so values agree with a local run within
float32 rounding of the sums (a few ulp of the sum per round).

Limits (TFF 0.87): secure sums (`tff.federated_secure_sum_bitwidth`, TFF's `SecureSumFactory`,
this project's SecAgg chain) cannot be split across workers: TFF's mergeable compiler rejects them
(`AfterMergeStructureError`), so `check_no_secure_sum` refuses such a process up front. A worker that
stops answering makes the running computation fail with a gRPC error (`is_worker_failure`); the
caller may re-run the round on the workers that still answer (`responsive_workers`), which gives the
same result because a round's output depends only on its input state and data.
"""

import re
from typing import Iterable, Sequence, Tuple, Union

import grpc

# As TFF's local C++ context: messages up to 2 GB (model weights and partial sums travel whole).
_MAX_MESSAGE_BYTES = 2**31 - 1
_CHANNEL_OPTIONS = (('grpc.max_message_length', _MAX_MESSAGE_BYTES),
                    ('grpc.max_receive_message_length', _MAX_MESSAGE_BYTES),
                    ('grpc.max_send_message_length', _MAX_MESSAGE_BYTES))
_ADDRESS = re.compile(r'^(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})$')
_SECURE_SUM_INTRINSIC = 'federated_secure_sum'
#: Why a run with SecAgg cannot use remote workers (checked in `check_no_secure_sum`).
SECURE_SUM_ERROR = ('secure aggregation cannot run on remote workers: TFF 0.87 splits a round '
                    'across workers only for plain sums (its mergeable compiler rejects secure sums '
                    'with AfterMergeStructureError); drop `workers` or `secure_aggregation`.')
# How long a worker whose call failed may take to accept a new connection before it counts as gone.
_RECONNECT_SECONDS = 5.0


class WorkerUnavailableError(RuntimeError):
  """A worker does not answer; the message names its address."""


def parse_worker_addresses(addresses: Union[str, Iterable[str]],
                           name: str = 'addresses') -> Tuple[str, ...]:
  """'host:port,host:port' (or a sequence of 'host:port') as a tuple of distinct addresses.

  Raises:
    ValueError (naming the parameter `name`): `addresses` is empty, holds a malformed entry, a port
      outside 1..65535, or a duplicate.
  """
  if not isinstance(addresses, str):
    try:
      addresses = list(addresses)
    except TypeError:
      raise ValueError(f'`{name}` must be a string host:port,... or a sequence of host:port, got '
                       f'{addresses!r}.') from None
  items = addresses.split(',') if isinstance(addresses, str) else addresses
  items = [str(item).strip() for item in items if str(item).strip()]
  if not items:
    raise ValueError(f'`{name}` must name at least one worker as host:port.')
  for item in items:
    match = _ADDRESS.match(item)
    if match is None:
      raise ValueError(f'`{name}`: {item!r} is not host:port.')
    if not 1 <= int(match['port']) <= 65535:
      raise ValueError(f'`{name}`: the port of {item!r} must lie in 1..65535.')
  duplicates = sorted({item for item in items if items.count(item) > 1})
  if duplicates:
    raise ValueError(f'`{name}` names {duplicates[0]!r} twice.')
  return tuple(items)


def _channel(address: str) -> grpc.Channel:
  return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)


def worker_answers(address: str, timeout_seconds: float = 2.0) -> bool:
  """Whether a gRPC server accepts a connection at `address` within `timeout_seconds`."""
  channel = _channel(address)
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout_seconds)
    return True
  except grpc.FutureTimeoutError:
    return False
  finally:
    channel.close()


def wait_for_workers(addresses: Sequence[str], timeout_seconds: float = 30.0) -> None:
  """Blocks until every worker accepts connections.

  Raises:
    ValueError: bad `addresses` or `timeout_seconds` <= 0.
    WorkerUnavailableError: a worker did not answer within `timeout_seconds` (the first one named).
  """
  addresses = parse_worker_addresses(addresses)
  if not timeout_seconds > 0:
    raise ValueError(f'`timeout_seconds` must be > 0, got {timeout_seconds!r}.')
  for address in addresses:
    if not worker_answers(address, timeout_seconds):
      raise WorkerUnavailableError(
          f'TFF worker {address} did not answer within {timeout_seconds:g} s; start it (the '
          '`worker_binary` of the tensorflow_federated wheel, docs/distributed.md) or check the '
          'address and the network.')


def responsive_workers(addresses: Sequence[str], timeout_seconds: float = 2.0) -> Tuple[str, ...]:
  """The workers of `addresses` that accept a connection now (in the given order)."""
  return tuple(a for a in parse_worker_addresses(addresses) if worker_answers(a, timeout_seconds))


class _FailFastStub:
  """The gRPC stub of one worker, failing fast when the worker is gone.

  TFF's asynchronous context retries a call that failed with UNAVAILABLE forever (every 30 s), so a
  dead worker would hang the round. A retryable failure is re-raised as TFF's retryable error only
  while the worker still accepts connections (a transient failure); otherwise it becomes a
  `WorkerUnavailableError` naming the address, which TFF does not retry.
  """

  def __init__(self, stub, address: str, retryable_error_type):
    self._stub = stub
    self._address = address
    self._retryable_error_type = retryable_error_type

  def __getattr__(self, name):
    attribute = getattr(self._stub, name)
    if not callable(attribute):
      return attribute

    def call(*args, **kwargs):
      try:
        return attribute(*args, **kwargs)
      except self._retryable_error_type as error:
        if worker_answers(self._address, _RECONNECT_SECONDS):
          raise
        raise WorkerUnavailableError(f'TFF worker {self._address} stopped answering.') from error

    return call


def _worker_context(address: str):
  """An asynchronous TFF context running every computation on the worker at `address`."""
  # TensorFlow Federated is imported here, not at the top, so that a worker launcher and the
  # address checks start without TensorFlow. TFF 0.87 exports
  # neither the remote executor, its gRPC stub, nor the executor factory and context classes that
  # compose them; these are the modules TFF's own local C++ context is built from.
  import tensorflow_federated as tff
  from tensorflow_federated.python.core.backends.native import compiler as native_compiler
  from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation,
  )
  from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
  from tensorflow_federated.python.core.impl.executors import (
    executors_errors,
    remote_executor,
    remote_executor_grpc_stub,
  )
  stub = _FailFastStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub(_channel(address)), address,
                       executors_errors.RetryableGRPCError)

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


def create_remote_execution_context(addresses: Union[str, Sequence[str]]):
  """TFF's mergeable context over the workers at `addresses` (not installed; see the module doc).

  Each call of a federated computation splits its clients into one group per worker (in order,
  as equal as possible), runs the groups in parallel, merges their partial aggregates and runs the
  server part once.
  """
  from tensorflow_federated.python.core.backends.native import execution_contexts
  addresses = parse_worker_addresses(addresses)
  return execution_contexts.create_mergeable_comp_execution_context(
      [_worker_context(address) for address in addresses])


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
    WorkerUnavailableError: a worker did not answer within `timeout_seconds`.
  """
  import tensorflow_federated as tff
  addresses = parse_worker_addresses(addresses)
  wait_for_workers(addresses, timeout_seconds)
  tff.framework.get_context_stack().set_default_context(create_remote_execution_context(addresses))
  return addresses


def is_worker_failure(error: BaseException) -> bool:
  """Whether `error` (or an exception it was raised from) is a lost worker or a gRPC failure."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, WorkerUnavailableError):
      return True
    if isinstance(error, grpc.RpcError):
      code = error.code() if callable(getattr(error, 'code', None)) else None
      return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                      grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN,
                      grpc.StatusCode.INTERNAL, None)
    error = error.__cause__ or error.__context__
  return False


def check_no_secure_sum(computation) -> None:
  """Refuses a `tff.Computation` holding a secure sum: TFF 0.87's mergeable compiler cannot split it.

  Raises:
    ValueError: `computation` calls `federated_secure_sum*`.
  """
  text = str(computation.to_building_block())
  if _SECURE_SUM_INTRINSIC in text:
    raise ValueError(SECURE_SUM_ERROR)
