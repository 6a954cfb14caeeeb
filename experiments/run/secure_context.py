"""The TFF execution context of SecAgg runs: TFF's test context, selected once, or a clear error.

Secure sums (`tff.federated_secure_sum_bitwidth`, which TFF's `SecureSumFactory` emits) run only in
a context that lowers them to plain TensorFlow: TFF's test context
(`tff.backends.test.create_sync_test_cpp_execution_context`). TFF's default native C++ context
rejects them at run time with a raw gRPC error from its worker (`INVALID_ARGUMENT: Cannot embed a
federated value ...`).

Two TFF behaviours decide how the context is chosen:
  * `set_default_context` replaces only the bottom of TFF's context stack. A context the caller
    installed above it (`tff.framework.get_context_stack().install(...)`) keeps running every
    computation, so replacing the default does not help there.
  * Replacing a context drops it, and a local C++ context's destructor sends SIGINT to its
    `worker_binary` and waits for it. A worker started by a process that ignores SIGINT (a
    background job of a non-interactive shell, nohup, CI runners, `tools/in_session.sh`) inherits
    the ignored SIGINT and never exits: the switch hangs once the old context has run a computation.
    The replaced context is therefore kept alive, attached to the new one: it is released together
    with the new context, exactly when TFF would release its own default context.

`use_secure_context()` replaces TFF's import-time default context with the test context (safe even
after computations ran in it); it accepts any other active context that passes a one-client secure
sum probe (e.g. the test context a caller set), and otherwise raises `SecureContextError` with a
one-line message saying what to change.

`async_secure_context()` is TFF's asynchronous test context, for the training loop (which installs
it itself), with Python protobuf's nesting limit lifted first (`allow_deep_computations`): TFF's
test contexts cannot compile a computation nested more than 100 messages deep once its secure sums
are replaced by their bodies, and the loop's process (composed over client ids) is that deep.
"""

from typing import Optional

import numpy as np
import tensorflow_federated as tff
from google.protobuf.internal import api_implementation

# The context TFF installs when it is imported (native C++, no secure sums). Captured at import; a
# context set before this module was imported is taken for TFF's own.
_TFF_DEFAULT_CONTEXT = tff.framework.get_context_stack().current
# Attribute marking the test contexts created here, and the one holding the context they replaced.
_MARK = '_dp_ftrl_tff_secure_context'
_REPLACED = '_dp_ftrl_tff_replaced_context'


class SecureContextError(RuntimeError):
  """The active TFF execution context cannot run secure sums; the message says what to change."""


def is_secure_context(context) -> bool:
  """True for a test context created by `use_secure_context`."""
  return getattr(context, _MARK, False) is True


def use_secure_context() -> tff.framework.SyncContext:
  """Makes the active TFF context one that runs secure sums, and returns it.

  * already such a context (created here, or one that passes the secure-sum probe): kept;
  * TFF's import-time default context: replaced by TFF's test context (kept alive, see the module
    docstring, so this works even after computations ran in it);
  * any other context (set or installed by the caller): `SecureContextError`.

  Raises:
    SecureContextError: the active context cannot run secure sums and is not TFF's default.
  """
  stack = tff.framework.get_context_stack()
  current = stack.current
  if is_secure_context(current):
    return current
  if current is _TFF_DEFAULT_CONTEXT:
    allow_deep_computations()  # the drivers' secure process is 4 levels below the limit
    context = tff.backends.test.create_sync_test_cpp_execution_context()
    setattr(context, _MARK, True)
    setattr(context, _REPLACED, current)
    stack.set_default_context(context)
    if stack.current is context:
      return context
    current = stack.current  # TFF's default was also installed above the bottom of the stack.
  problem = secure_sum_problem(current)
  if problem is None:
    return current
  raise SecureContextError(
      f'`secure_aggregation` needs a TFF execution context that runs secure sums, but the active '
      f'one ({type(current).__name__}, set or installed by the caller) {problem}; call '
      'tff.backends.test.set_sync_test_cpp_execution_context() before any TFF computation runs, '
      'or leave TFF\'s default context in place so that the driver selects the test context.')


def secure_sum_problem(context) -> Optional[str]:
  """None if `context` computes a one-client secure sum correctly, else what went wrong."""
  if not isinstance(context, tff.framework.SyncContext):
    return 'is not synchronous'

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def probe(value):
    return tff.federated_secure_sum_bitwidth(value, 4)

  with tff.framework.get_context_stack().install(context):
    try:
      result = probe([3])
    except Exception as error:  # pylint: disable=broad-except
      return f'failed a secure-sum probe ({_short(error)})'
  if int(np.asarray(result)) != 3:
    return f'returned {result!r} for a secure sum of 3'
  return None


def _short(error: Exception) -> str:
  """First sentence of an error, with the gRPC status code for RPC errors."""
  code = getattr(error, 'code', None)
  details = getattr(error, 'details', None)
  if callable(code) and callable(details):
    try:
      text = f'{code().name}: {details()}'
    except Exception:  # pylint: disable=broad-except
      text = str(error)
  else:
    text = f'{type(error).__name__}: {error}'
  text = ' '.join(text.split())
  text = text.split(' while ')[0]
  return text if len(text) <= 160 else text[:157] + '...'


def async_secure_context():
  """TFF's asynchronous test context (`tff.backends.test.create_async_test_cpp_execution_context`:
  it runs secure sums), after `allow_deep_computations()`. For the training loop, which installs it
  in a `tff.program.NativeFederatedContext`."""
  allow_deep_computations()
  return tff.backends.test.create_async_test_cpp_execution_context()


def allow_deep_computations() -> bool:
  """Lifts Python protobuf's limit of 100 nested messages per parse, for this whole process.

  TFF's test contexts compile every computation with `replace_secure_intrinsics_with_bodies`
  (tensorflow_federated/python/core/backends/test/compiler.py): it inlines each secure sum's
  TensorFlow body (about 17 proto levels below the intrinsic) and serializes the result again, one
  building block at a time (`building_blocks.Lambda._proto`: `pb.Lambda(result=...)`). Protobuf's
  upb backend (Python protobuf's default) copies a sub-message given to a constructor by
  serializing and parsing it, and that parse refuses more than 100 nested levels:
  `google.protobuf.message.DecodeError: Error parsing message`, with nothing naming the depth.
  The secure DP-FTRL process's `next` nests 92 levels (96 after the replacement); composed with
  the dataset computation over client ids
  (`tff.simulation.compose_dataset_computation_with_learning_process`, the training loop's
  process) 99, over 100 after it (blt and tree, with adaptive clipping and restarts alike). TFF's
  own FedAvg with `DistributedDpSumFactory` (99) fails the same way. Lifting the limit only lets
  parses accept deeper messages.

  Returns:
    Whether the limit was lifted: `SetAllowOversizeProtos(True)` of the upb or C++ backend; False
    with the pure-Python one, which copies sub-messages without parsing them.
  """
  kind = api_implementation.Type()
  if kind == 'upb':
    from google._upb import _message  # pylint: disable=g-import-not-at-top
  elif kind == 'cpp':
    from google.protobuf.pyext import _message  # pylint: disable=g-import-not-at-top
  else:
    return False
  _message.SetAllowOversizeProtos(True)
  return True
