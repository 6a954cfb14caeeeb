"""The TFF execution context of SecAgg runs: TFF's asynchronous test context, able to compile the
loop's process.

Secure sums (`tff.federated_secure_sum_bitwidth`, which TFF's `SecureSumFactory` emits) run only in
a context that lowers them to plain TensorFlow: TFF's test contexts
(`tff.backends.test.create_async_test_cpp_execution_context`). TFF's default native C++ context
rejects them at run time with a raw gRPC error from its worker (`INVALID_ARGUMENT: Cannot embed a
federated value ...`). The training loop installs its context itself, over the caller's, for the
run only, so a caller's own context (one that cannot run secure sums included) is never in the way.

`async_secure_context()` is that context, with Python protobuf's nesting limit lifted first
(`allow_deep_computations`): TFF's test contexts cannot compile a computation nested more than 100
messages deep once its secure sums are replaced by their bodies, and the loop's process (composed
over client ids) is that deep.
"""

import tensorflow_federated as tff
from google.protobuf.internal import api_implementation


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
