"""Up-front memory checks of `dp_ftrl_tff.mechanisms.memory`: estimates and refusals."""

import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import banded, memory
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit


def test_estimates_are_quadratic_only_where_a_matrix_is_materialized():
  assert memory.estimate_bytes('banded', 1000) == 32 * 1000**2
  assert memory.estimate_bytes('tree_full', 1000) == 24 * 1000**2 + 33 * 1000
  assert memory.estimate_bytes('tree_full', 1000, losses=False) == 33 * 1000
  assert memory.estimate_bytes('blt', 10**9) == 56 * 10**9
  assert memory.estimate_bytes('gaussian', 10**12) == 0


def test_check_fits_names_the_flag_and_the_memory():
  memory.check_fits('blt', 1000, available=10**6)
  with pytest.raises(memory.MemoryLimitError, match=r'--rounds=1000000000 is too large for blt: '
                     r'.* about 56\.0 GB \(56 n bytes .*only 1\.0 GB'):
    memory.check_fits('blt', 10**9, available=10**9)
  with pytest.raises(ValueError, match='32 n\\^2 bytes'):
    memory.check_fits('banded', 10**6, available=10**9)


def test_banded_estimate_bounds_what_evaluation_allocates():
  import tracemalloc
  n = 300
  strategy = banded.BandedStrategy(np.eye(n) + np.eye(n, k=-1))
  tracemalloc.start()
  strategy.losses(n, participation_lib.ParticipationSchema(min_sep=10))
  peak = tracemalloc.get_traced_memory()[1]
  tracemalloc.stop()
  assert peak >= 0.9 * memory.estimate_bytes('banded', n)  # a lower bound of the real need


def test_canary_estimate_and_refusal_name_the_flag_and_the_memory():
  assert memory.estimate_canary_bytes(1000, 20) == 1000 * (152 + 16 * 20)
  memory.check_canaries_fit(1000, 20, available=10**9)
  with pytest.raises(memory.MemoryLimitError, match=r'--canary_clients=1000000000 is too large: '
                     r'.*about 472\.0 GB \(152 N \+ 16 N n bytes.*only 1\.0 GB'):
    memory.check_canaries_fit(10**9, 20, available=10**9)


def test_format_bytes_of_astronomical_sizes_stays_short():
  assert memory.format_bytes(1.75e46) == '1.75e+28 EB'
