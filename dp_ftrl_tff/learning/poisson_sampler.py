"""Poisson and b-hat-cyclic Poisson client sampling (the random cohorts of `sampling.Sampling`).

  * 'poisson': in round t every client participates independently with probability q.
  * 'cyclic_poisson' (BandMF paper Alg. 2 with Poisson draws, Sec. 7; docs/papers.md): the population
    is split once into b-hat fixed groups, and round t draws each member of group t mod b-hat
    independently with probability q. Two participations of a client are a multiple of b-hat rounds
    apart, so the run also satisfies the b-min-sep schema with b = b-hat.

Rounds are 0-based. The cohort size is random and may be 0 (the training loop still runs the round,
so its noise is added); the mean divides by the fixed `Sampling.expected_clients_per_round`.

Reproducibility: the groups are a seeded permutation of the population (stream 0 of `seed`), and the
coins of round t come from their own stream (1, t) of `seed` (numpy `SeedSequence` spawn keys), so a
round's cohort is a pure function of (seed, population, t): a resumed run needs no history, only the
next round (its `state`), and draws what an uninterrupted run draws.
"""

from typing import Dict, List, Optional, Sequence

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff import sampling as sampling_lib

# SeedSequence spawn keys of the two random streams (see the module docstring).
_GROUPS_STREAM = (0,)
_ROUND_STREAM = 1


def _rng(seed: int, spawn_key) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=spawn_key))


_STATE_KEYS = ('next_round', 'population')


class PoissonSampler(sampling_lib.Sampler):
  """Draws Poisson or cyclic-Poisson cohorts (kinds 'poisson' and 'cyclic_poisson').

  Its `state`: 'next_round' (the draws need no history) and 'population' (checked on restore).
  """

  def __init__(self, client_ids: Sequence[str], sampling: sampling_lib.Sampling, *,
               seed: int = 0):
    """Builds a sampler.

    Args:
      client_ids: the population (unique ids); its size must be `sampling.population`. Groups and
        cohorts are drawn over this order, so the same order and seed give the same cohorts.
      sampling: a `Sampling` with random cohorts (kind, q, b-hat, population).
      seed: non-negative int; the groups and every round's coins derive from it.
    """
    client_ids = list(client_ids)
    if not isinstance(sampling, sampling_lib.Sampling) or not sampling.random_cohorts:
      raise ValueError(f'`sampling` must be a Sampling of random cohorts, got {sampling!r}.')
    if len(set(client_ids)) != len(client_ids):
      raise ValueError('`client_ids` must be unique.')
    if len(client_ids) != sampling.population:
      raise ValueError(f'`client_ids` holds {len(client_ids)} clients, but `sampling.population`='
                       f'{sampling.population}.')
    self._client_ids = client_ids
    self._sampling = sampling
    self._seed = _validation.check_nonnegative_int(seed, 'seed')
    # Group g holds the clients at positions g, g + b-hat, g + 2 b-hat, ... of a seeded permutation:
    # sizes as `sampling.group_sizes()` states; each group sorted, so cohorts come in population order.
    order = _rng(self._seed, _GROUPS_STREAM).permutation(len(client_ids))
    self._groups = [np.sort(order[g::sampling.num_groups]) for g in range(sampling.num_groups)]
    self._next_round = 0

  @classmethod
  def from_plan(cls, client_ids: Sequence[str], plan, seed: int) -> 'PoissonSampler':
    return cls(client_ids, plan.sampling, seed=seed)

  @classmethod
  def from_config(cls, client_ids: Sequence[str], config: dict) -> 'PoissonSampler':
    if not isinstance(config, dict) or set(config) != {'sampling', 'seed'}:
      raise ValueError(f"`config` must be a dict with keys ['sampling', 'seed'], got {config!r}.")
    settings = config['sampling']
    if not isinstance(settings, dict):
      raise ValueError(f'`config.sampling` must be a dict, got {settings!r}.')
    return cls(client_ids, sampling_lib.Sampling(**settings), seed=config['seed'])

  def config(self) -> dict:
    return {'sampling': self._sampling.to_config(), 'seed': self._seed}

  @property
  def client_ids(self) -> List[str]:
    return list(self._client_ids)

  @property
  def sampling(self) -> sampling_lib.Sampling:
    return self._sampling

  @property
  def cohort_size(self) -> Optional[int]:
    return None

  @property
  def next_round(self) -> int:
    return self._next_round

  def group(self, group_num: int) -> List[str]:
    """The client ids of group `group_num` (0 .. b-hat - 1), drawn from in rounds t = group_num
    (mod b-hat)."""
    group_num = _validation.check_nonnegative_int(group_num, 'group_num')
    if group_num >= self._sampling.num_groups:
      raise ValueError(f'`group_num` must be below {self._sampling.num_groups}, got {group_num}.')
    return [self._client_ids[i] for i in self._groups[group_num]]

  @property
  def state(self) -> Dict[str, np.ndarray]:
    return {'next_round': np.int64(self._next_round),
            'population': np.int64(len(self._client_ids))}

  def load_state(self, state: Dict[str, np.ndarray]) -> None:
    state = sampling_lib.check_state_keys(state, _STATE_KEYS)
    population = int(state['population'])
    if population != len(self._client_ids):
      raise ValueError(f'`state` comes from a population of {population} clients, the sampler '
                       f'has {len(self._client_ids)}: the population changed since the checkpoint.')
    self._next_round = _validation.check_nonnegative_int(int(state['next_round']),
                                                         'state.next_round')

  def cohort_indices(self, round_num: int) -> np.ndarray:
    """Indices (into `client_ids`, increasing) of the cohort of round `round_num`, without recording
    it: each member of group `round_num` mod b-hat with probability q, from the round's own stream."""
    round_num = _validation.check_nonnegative_int(round_num, 'round_num')
    members = self._groups[round_num % self._sampling.num_groups]
    coins = _rng(self._seed, (_ROUND_STREAM, round_num)).random(members.size)
    return members[coins < self._sampling.sampling_prob]

  def sample(self, round_num: int) -> List[str]:
    """Draws the cohort of round `round_num` (must be the next round) and records the round.

    Returns:
      The client ids of the cohort in population order; possibly none.

    Raises:
      ValueError: if `round_num` is not the next round.
    """
    round_num = _validation.check_nonnegative_int(round_num, 'round_num')
    if round_num != self._next_round:
      raise ValueError(f'`round_num` must be the next round {self._next_round}, got {round_num}.')
    chosen = self.cohort_indices(round_num)
    self._next_round = round_num + 1
    return [self._client_ids[i] for i in chosen]

  def __repr__(self) -> str:
    s = self._sampling
    return (f'PoissonSampler(kind={s.kind!r}, sampling_prob={s.sampling_prob!r}, num_groups='
            f'{s.num_groups}, population={s.population}, seed={self._seed})')
