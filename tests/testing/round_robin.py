"""A test-only sampler kind, 'test_round_robin', added the way a user adds one.

Round t (0-based) draws the m = `plan.clients_per_round` clients at positions t*m .. t*m + m - 1
(mod the population) of the population order: fixed cohorts, every client once per
ceil(population / m) rounds. The `Sampler` subclass and the registry entry (`KIND`) are all it
takes; no other module knows the name. `tests/new_sampler_test.py` registers it with
`sampling.registered`.
"""

from typing import Dict, List, Sequence

import numpy as np

from dp_ftrl_tff import _validation, sampling

NAME = 'test_round_robin'


class RoundRobinSampler(sampling.Sampler):
  """`clients_per_round` clients a round, taken in turn from the population order."""

  def __init__(self, client_ids: Sequence[str], clients_per_round: int):
    self._client_ids = list(client_ids)
    if not self._client_ids or len(set(self._client_ids)) != len(self._client_ids):
      raise ValueError('`client_ids` must be unique and not empty.')
    self._clients_per_round = _validation.check_positive_int(clients_per_round,
                                                             'clients_per_round')
    if self._clients_per_round > len(self._client_ids):
      raise ValueError(f'`clients_per_round`={clients_per_round} exceeds the population.')
    self._next_round = 0

  @classmethod
  def from_plan(cls, client_ids: Sequence[str], plan, seed: int) -> 'RoundRobinSampler':
    del seed  # the turns are not random
    return cls(client_ids, int(plan.clients_per_round))

  @classmethod
  def from_config(cls, client_ids: Sequence[str], config: dict) -> 'RoundRobinSampler':
    return cls(client_ids, config['clients_per_round'])

  def config(self) -> dict:
    return {'clients_per_round': self._clients_per_round}

  @property
  def client_ids(self) -> List[str]:
    return list(self._client_ids)

  @property
  def cohort_size(self) -> int:
    return self._clients_per_round

  @property
  def next_round(self) -> int:
    return self._next_round

  def sample(self, round_num: int) -> List[str]:
    if round_num != self._next_round:
      raise ValueError(f'`round_num` must be the next round {self._next_round}, got {round_num}.')
    start, n = round_num * self._clients_per_round, len(self._client_ids)
    self._next_round += 1
    return [self._client_ids[(start + i) % n] for i in range(self._clients_per_round)]

  @property
  def state(self) -> Dict[str, np.ndarray]:
    return {'next_round': np.int64(self._next_round)}

  def load_state(self, state: Dict[str, np.ndarray]) -> None:
    state = sampling.check_state_keys(state, ('next_round',))
    self._next_round = _validation.check_nonnegative_int(int(state['next_round']),
                                                         'state.next_round')


KIND = sampling.SamplerKind(NAME, f'{__name__}:RoundRobinSampler', random_cohorts=False,
                            summary='test-only: clients in turn, in population order')
