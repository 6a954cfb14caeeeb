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


def test_noise_state_is_refused_with_the_option_that_sets_its_buffers():
  from dp_ftrl_tff.mechanisms import blt, registry, square_root
  # The EMNIST CNN (1.66M parameters) with a 1000-buffer BLT: 19 copies x 4 bytes x P x 1000.
  many = blt.BLTStrategy(np.linspace(0.99, 0.5, 1000), np.full(1000, 0.5 / 1000))
  assert memory.estimate_noise_state_bytes(many, 20, 1_663_370) == 19 * 4 * 1_663_370 * 1000
  with pytest.raises(memory.MemoryLimitError, match=r'the blt noise state holds 1000 model-sized '
                     r'buffers \(from `num_buffers`\) of 1663370 float32 .*about 126\.4 GB .*'
                     r'only 24\.0 GB'):
    memory.check_noise_state_fits(many, 20, 1_663_370, available=24 * 10**9)
  memory.check_noise_state_fits(blt.BLTStrategy((0.9,), (0.1,)), 20, 1_663_370,
                                available=24 * 10**9)
  with pytest.raises(ValueError, match='from `num_bands`'):
    memory.check_noise_state_fits(square_root.BandedSquareRootStrategy(10**6), 20, 10**6,
                                  available=24 * 10**9)
  # Gaussian noise and the vanilla tree hold none; Honaker's tree floor(log2(n + 1)).
  for name, vectors in (('gaussian', 0), ('tree', 0), ('tree_efficient', 10)):
    assert memory.noise_state_vectors(registry.default_strategy(name), 1023) == vectors


def test_time_limit_names_the_estimate_and_the_remedy():
  assert [memory.format_seconds(s) for s in (0.5, 60, 5400, 86400 * 3, float('inf'))] == [
      '0.5 seconds', '1 minute', '1.5 hours', '3 days', 'forever']
  memory.check_seconds(memory.MAX_SECONDS, 'x', 'y')
  with pytest.raises(memory.ComputeLimitError, match=r'^`n`=5: it would take about 2 hours on '
                     r"this project's machine type, above the 1 hour .*; use fewer\.$"):
    memory.check_seconds(7200.0, '`n`=5: it', 'use fewer.')


def test_a_generated_population_is_bounded_by_memory_and_time():
  memory.check_generated_clients(1000, 20, 3140, 1e-3, 1e-5, available=10**9)
  with pytest.raises(memory.MemoryLimitError, match=r'`num_clients`=1000000000 clients of '
                     r'`examples_per_client`=20 examples: .*about 62\.8 TB \(3140 bytes'):
    memory.check_generated_clients(10**9, 20, 3140, 1e-3, 1e-5, available=10**9)
  with pytest.raises(memory.ComputeLimitError, match='generating the population would take about '
                     '11.6 days'):
    memory.check_generated_clients(10**8, 1, 1, 1e-2, 0.0, available=10**12)


def test_a_model_and_its_batch_activations_are_bounded_by_memory():
  memory.check_model_fits(4_050_748, '`vocab_size`=10000', 16 * 20 * 13_500,
                          available=24 * 10**9)
  with pytest.raises(memory.MemoryLimitError, match=r'^`vocab_size`=10\^9: a model of 1\.93e\+11 '
                     r'float32 parameters and 0 activations .* about 61\.8 TB \(80 copies'):
    memory.check_model_fits(193_000_000_000, '`vocab_size`=10^9', available=24 * 10**9)
