"""A synthetic participation log of cyclic cohorts, as large as a production run's, for the
accounting benchmarks (`accounting_bench`, `participation_log_bench`)."""

import numpy as np


def write_synthetic_log(path: str, num_clients: int, rounds: int, per_round: int,
                        seed: int = 0) -> int:
  """Writes the synthetic log with '\\r\\n' line ends (as csv.writer does); returns the row count.

  Round r holds the `per_round` clients after the first r * per_round of a seeded permutation of the
  `num_clients` (cyclically), so each client participates every num_clients / per_round rounds.

  Raises:
    ValueError: `num_clients`, `rounds` or `per_round` is not a positive integer, or `per_round`
      exceeds `num_clients`.
  """
  for name, value in (('num_clients', num_clients), ('rounds', rounds), ('per_round', per_round)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'`{name}` must be a positive integer, got {value!r}.')
  if per_round > num_clients:
    raise ValueError(f'`per_round` ({per_round}) must be at most `num_clients` ({num_clients}).')
  rng = np.random.default_rng(seed)
  width = len(str(num_clients - 1))
  ids = np.array([f'c{i:0{width}d},' for i in range(num_clients)], dtype=f'S{width + 2}')
  id_bytes = ids.view(np.uint8).reshape(num_clients, width + 2)
  order = rng.permutation(num_clients)
  with open(path, 'wb') as f:
    f.write(b'client_id,round\r\n')
    for r in range(rounds):
      chosen = order[np.arange(r * per_round, (r + 1) * per_round) % num_clients]
      suffix = np.frombuffer(f'{r}\r\n'.encode(), np.uint8)
      block = np.concatenate([id_bytes[chosen], np.broadcast_to(suffix, (per_round, suffix.size))],
                             axis=1)
      f.write(block.tobytes())
  return rounds * per_round
