"""A cooperative stop of the library's long computations: the check a program installs.

A program that stops on SIGINT / SIGTERM (the drivers: `dp_ftrl_tff.training.stop_signals`) records the signal in its handler and installs a check with
`stop_check(check)`; the library calls `check()` at its safe points, and `check` raises (any
exception the program chooses) to stop there:
  * each objective evaluation of the optimizers run at a run's start or in its report
    (`mechanisms.blt.optimize_blt`, `mechanisms.banded_optimizer.optimize_banded`);
  * each accountant evaluation of a calibration (`accounting.calibration.calibrate`, which the
    amplified calibration calls too), of the amplified calibration's bracket search, and of a
    guarantee (`accounting.zcdp_epsilon`'s PLD / RDP conversion, which the report runs many times);
  * each row of the equal-privacy table (`accounting.equal_privacy`), each chunk of the Monte Carlo
    accountant's samples;
  * the start of each round of the train_model data source
    (`programs.data_source.SampledClientDataSourceIterator.select`), the only point of
    `tff.learning.programs.train_model`'s loop that runs in the loop's own task, between rounds.
Without an installed check (the default) `check()` does nothing.

Why a check, not an exception raised by the signal handler. Python runs a signal handler between
two bytecodes of the main thread, wherever that thread is: inside a garbage-collection callback
(jax's `_xla_gc_callback` runs after every collection once TensorFlow Federated is imported), an
asyncio done-callback (`train_model`'s tasks report their results from one), a `__del__`. An
exception raised there is printed as "Exception ignored in: ..." and dropped, and the computation
goes on. The libraries give no other way in: scipy's L-BFGS-B has no cancellation (a `callback`
can only end the optimization with a result), dp_accounting's calibration has no hook, and
train_model has no stop between rounds. So the handler records, and the long loops ask.

The check is module state (one per process, like the signal handlers it serves), read on every
call; it must be cheap, and it may be called from any thread that runs these computations.
"""

import contextlib
from typing import Callable, Iterator, Optional

_check: Optional[Callable[[], None]] = None


def check() -> None:
  """Calls the installed check, which raises to stop the computation here; without one, nothing."""
  current = _check
  if current is not None:
    current()


@contextlib.contextmanager
def stop_check(fn: Optional[Callable[[], None]]) -> Iterator[None]:
  """Installs `fn` as the check for the block (None: no check), then restores the previous one.

  Raises:
    ValueError: `fn` is neither callable nor None.
  """
  global _check
  if fn is not None and not callable(fn):
    raise ValueError(f'`fn` must be callable or None, got {fn!r}.')
  previous, _check = _check, fn
  try:
    yield
  finally:
    _check = previous
