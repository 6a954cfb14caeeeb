"""Runs TFF computations on TFF's own remote workers: one round's clients split across machines.

TFF ships the engine: the C++ `worker_binary` in the `tensorflow_federated` wheel
(`tensorflow_federated/data/worker_binary --port=P`, insecure gRPC on all interfaces) runs
computations sent to it. TFF's mergeable execution context compiles a federated computation into
"up to merge" work (client work and partial aggregates) that each worker runs on its share of the
clients, a merge of the partial aggregates, and "after merge" work (the server step, e.g. the
correlated noise) that runs once. TFF 0.87's wheel lacks the helpers that connect that context to
remote workers (`cpp_execution_contexts`' remote variants), so this project wires it
(`dp_ftrl_tff.learning.remote_contexts`, the one place the contexts are built): one
`RemoteExecutor` per worker address in a `ResourceManagingExecutorFactory` and an
`AsyncExecutionContext` with TFF's native compiler, all of them in a
`MergeableCompExecutionContext`. `remote_contexts.set_remote_execution_context` installs it as
TFF's default (synchronous) context; `remote_contexts.create_async_remote_execution_context` gives
the same workers as an asynchronous context, for `tff.program.NativeFederatedContext` and
`tff.learning.programs.train_model`. This module (the workers' addresses, availability and
failures) does not import TensorFlow.

Results: the server step runs once, after the merge, so the noise is added once, exactly as in a
local run; the client sums are merged in another order, so values agree with a local run within
float32 rounding of the sums (a few ulp of the sum per round).

Limits (TFF 0.87): secure sums (`tff.federated_secure_sum_bitwidth`, TFF's `SecureSumFactory`,
this project's SecAgg chain) cannot be split across workers: TFF's mergeable compiler rejects them
(`AfterMergeStructureError`), so `check_no_secure_sum` refuses such a process up front. A worker that
stops answering makes the running call fail fast with a `WorkerUnavailableError` naming it
(`is_worker_failure`); both contexts then run the call again on the workers that still answer
(`responsive_workers`), which gives the same result because a call's output depends only on its
arguments (a round's: its input state and data). When none answers, the call raises
`WorkersLostError`.
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


class WorkerUnavailableError(RuntimeError):
  """A worker does not answer; the message names its address."""


class WorkersLostError(WorkerUnavailableError):
  """Every worker of a remote context stopped answering during a computation."""


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


def channel(address: str) -> grpc.Channel:
  """An insecure gRPC channel to `address` taking messages up to 2 GB."""
  return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)


def worker_answers(address: str, timeout_seconds: float = 2.0) -> bool:
  """Whether a gRPC server accepts a connection at `address` within `timeout_seconds`."""
  connection = channel(address)
  try:
    grpc.channel_ready_future(connection).result(timeout=timeout_seconds)
    return True
  except grpc.FutureTimeoutError:
    return False
  finally:
    connection.close()


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
