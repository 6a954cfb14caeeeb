"""Min-sep client sampling that behaves like an on-device participation timer.

Implements the b-min-sep participation schema of the BandMF paper (Definition 1) and the BLT paper
(Sec. 3.1) the way production systems enforce it (Gboard paper, Sec. 2: a device that contributed waits
out a timer before it checks in again):

  * Rounds are 0-based: t = 0 .. n-1.
  * `min_sep` = b: a client that participated in round r is eligible again from round r + b on, so two
    participations r1 < r2 always satisfy r2 - r1 >= b. (TF-Privacy's `min_separation` = b - 1.)
  * `max_participations` = k (optional): a client that has participated k times is never drawn again.
  * Each round draws exactly `clients_per_round` clients from the eligible pool. Without a cap the
    draw is uniform without replacement. With a cap, clients with the fewest participations so far
    (the most left) come first: whole tiers of equally many participations while they fit, then a
    uniform draw without replacement within the next tier. The draw for round t is a pure function of
    (seed, t, the participation history), so a run resumed from a checkpointed sampler state draws
    exactly what an uninterrupted run draws.
  * The sampler fills every round of every schedule `check_schedule` accepts, and from any state it
    fills every schedule that any sampler could still fill (the proof is at `ClientSampler.sample`).

No privacy amplification is claimed for the random draw: the accountant uses only min_sep and k.
"""

from typing import Dict, List, Optional, Sequence

import numpy as np

from dp_ftrl_tff import _validation, sampling
from dp_ftrl_tff.mechanisms import participation as participation_lib

_NEVER = -1  # `last_round` of a client that has not participated yet.


def check_schedule(num_clients: int, clients_per_round: int, min_sep: int,
                   max_participations: Optional[int], num_rounds: int) -> None:
  """Raises ValueError when no sampler can fill every round of the schedule.

  In round t the clients of the previous min(b - 1, t) rounds are still waiting, so filling round t
  needs num_clients >= (min(b - 1, t) + 1) * clients_per_round; over n rounds that is
  num_clients >= min(b, n) * clients_per_round. With at most k participations per client, the n rounds
  need n * clients_per_round <= num_clients * k participations in total.

  The two conditions are also sufficient, and `ClientSampler` fills every schedule they accept.
  Write N = num_clients, m = clients_per_round. If N >= b * m, the cyclic schedule (slot j of round t
  goes to client (t * m + j) mod N) fills the rounds: a round's m clients are distinct (m <= N), a
  client's consecutive participations are N slots, so at least floor(N / m) >= b rounds, apart, and
  each client takes at most ceil(n * m / N) <= k. If N < b * m, the first condition means n * m <= N:
  no client needs to come back. The sampler finishes whenever any sampler can (`ClientSampler.sample`).

  Args:
    num_clients: size of the client population.
    clients_per_round: clients drawn in every round.
    min_sep: b >= 1, rounds between two participations of one client (r2 - r1 >= b).
    max_participations: k >= 1 or None (no cap).
    num_rounds: n, the number of rounds the run will train.
  """
  num_clients = _validation.check_positive_int(num_clients, 'num_clients')
  clients_per_round = _validation.check_positive_int(clients_per_round, 'clients_per_round')
  min_sep = _validation.check_positive_int(min_sep, 'min_sep')
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if max_participations is not None:
    max_participations = _validation.check_positive_int(max_participations, 'max_participations')
  if clients_per_round > num_clients:
    raise ValueError(f'`clients_per_round`={clients_per_round} exceeds the population of '
                     f'{num_clients} clients.')
  needed = min(min_sep, num_rounds) * clients_per_round
  if needed > num_clients:
    raise ValueError(
        f'Impossible schedule: `min_sep`={min_sep} with `clients_per_round`={clients_per_round} keeps '
        f'{needed} distinct clients busy over {min(min_sep, num_rounds)} consecutive rounds, but the '
        f'population has only {num_clients} clients. Lower `min_sep` or `clients_per_round`, or use '
        f'at least {needed} clients.')
  if max_participations is not None and num_rounds * clients_per_round > num_clients * max_participations:
    raise ValueError(
        f'Impossible schedule: {num_rounds} rounds of {clients_per_round} clients need '
        f'{num_rounds * clients_per_round} participations, but `max_participations`='
        f'{max_participations} allows only {num_clients * max_participations} for {num_clients} '
        f'clients.')


_STATE_KEYS = ('next_round', 'last_round', 'num_participations')


class ClientSampler(sampling.Sampler):
  """Draws each round's cohort from the clients whose min-sep timer has expired (kind 'min_sep').

  Its `state`: 'next_round' (the round the next `sample` draws), 'last_round' (int64[num_clients],
  the last round each client participated in, -1 for never) and 'num_participations'
  (int64[num_clients]); indices follow `client_ids`.
  """

  def __init__(self, client_ids: Sequence[str], clients_per_round: int, *, min_sep: int = 1,
               max_participations: Optional[int] = None, seed: int = 0,
               num_rounds: Optional[int] = None):
    """Builds a sampler.

    Args:
      client_ids: the population (unique ids). Order matters only for the state arrays.
      clients_per_round: clients drawn in every round.
      min_sep: b >= 1; a client that participated in round r is eligible again in round r + b.
      max_participations: k >= 1 or None (no cap on participations).
      seed: non-negative int; the draw of round t depends only on (seed, t, history).
      num_rounds: n, the rounds the run will sample (required with `max_participations`), or None:
        as many rounds as asked for.

    Raises:
      ValueError: a bad argument (named), or a schedule the sampler cannot fill (`check_schedule`
        of the n rounds; without `num_rounds`, of every number of rounds: b * clients_per_round
        clients are needed), checked here so that no round fails later.
    """
    client_ids = list(client_ids)
    if not client_ids:
      raise ValueError('`client_ids` must not be empty.')
    if len(set(client_ids)) != len(client_ids):
      raise ValueError('`client_ids` must be unique.')
    if num_rounds is None:
      if max_participations is not None:
        raise ValueError('`num_rounds` is required with `max_participations`: a cap of k '
                         'participations bounds the rounds a sampler can fill (n * '
                         'clients_per_round <= num_clients * k), so give the rounds it will sample '
                         'and the schedule is checked when it is built.')
      check_schedule(len(client_ids), clients_per_round, min_sep, None,
                     _validation.check_positive_int(min_sep, 'min_sep'))
    else:
      check_schedule(len(client_ids), clients_per_round, min_sep, max_participations, num_rounds)
    self._client_ids = client_ids
    self._clients_per_round = _validation.check_positive_int(clients_per_round, 'clients_per_round')
    if self._clients_per_round > len(client_ids):
      raise ValueError(f'`clients_per_round`={clients_per_round} exceeds the population of '
                       f'{len(client_ids)} clients.')
    self._min_sep = _validation.check_positive_int(min_sep, 'min_sep')
    self._max_participations = (
        None if max_participations is None else
        _validation.check_positive_int(max_participations, 'max_participations'))
    self._seed = _validation.check_nonnegative_int(seed, 'seed')
    self._num_rounds = None if num_rounds is None else int(num_rounds)
    self._next_round = 0
    self._last_round = np.full(len(client_ids), _NEVER, dtype=np.int64)
    self._num_participations = np.zeros(len(client_ids), dtype=np.int64)

  @classmethod
  def check_cohorts(cls, population: int, clients_per_round: Optional[float], participation,
                    num_rounds: int) -> None:
    """`check_schedule` of the cohorts (see `sampling.Sampler.check_cohorts`)."""
    check_schedule(population, clients_per_round, participation.min_sep,
                   participation.max_participations, num_rounds)

  @classmethod
  def from_plan(cls, client_ids: Sequence[str], plan, seed: int) -> 'ClientSampler':
    """`plan.clients_per_round` clients a round under `plan.participation` (b, k; default b = 1,
    no cap) over `plan.num_rounds`; ValueError for a plan made for accounting only, a fractional
    `clients_per_round` or a fixed-epoch participation."""
    m = plan.clients_per_round
    if m is None:
      raise ValueError('`plan` was made for accounting only: it has no `clients_per_round`.')
    if float(m) != int(m):
      raise ValueError(f'`plan.clients_per_round`={m} is fractional; min-sep sampling draws whole '
                       'cohorts.')
    schema = plan.participation or participation_lib.ParticipationSchema()
    if schema.fixed_epoch:
      raise ValueError('`plan.participation` is a fixed-epoch schema; the min-sep sampler enforces '
                       'b-min-sep participation only.')
    return cls(client_ids, int(m), min_sep=schema.min_sep,
               max_participations=schema.max_participations, seed=seed,
               num_rounds=plan.num_rounds)

  @classmethod
  def from_config(cls, client_ids: Sequence[str], config: dict) -> 'ClientSampler':
    if not isinstance(config, dict):
      raise ValueError(f'`config` must be a dict, got {type(config).__name__}.')
    try:
      return cls(client_ids, **config)
    except TypeError as error:  # a missing or unknown key
      raise ValueError(f'`config`: {error}') from error

  def config(self) -> dict:
    return {'clients_per_round': self._clients_per_round, 'min_sep': self._min_sep,
            'max_participations': self._max_participations, 'seed': self._seed,
            'num_rounds': self._num_rounds}

  @property
  def client_ids(self) -> List[str]:
    return list(self._client_ids)

  @property
  def min_sep(self) -> int:
    return self._min_sep

  @property
  def max_participations(self) -> Optional[int]:
    return self._max_participations

  @property
  def cohort_size(self) -> int:
    return self._clients_per_round

  @property
  def next_round(self) -> int:
    return self._next_round

  @property
  def state(self) -> Dict[str, np.ndarray]:
    return {'next_round': np.int64(self._next_round), 'last_round': self._last_round.copy(),
            'num_participations': self._num_participations.copy()}

  def load_state(self, state: Dict[str, np.ndarray]) -> None:
    state = sampling.check_state_keys(state, _STATE_KEYS)
    shape = (len(self._client_ids),)
    if state['last_round'].shape != shape or state['num_participations'].shape != shape:
      raise ValueError(f"`state` holds {state['last_round'].size} clients, the sampler has "
                       f'{len(self._client_ids)}: the population changed since the checkpoint.')
    self._next_round = _validation.check_nonnegative_int(int(state['next_round']),
                                                         'state.next_round')
    self._last_round, self._num_participations = state['last_round'], state['num_participations']

  def eligible(self, round_num: int) -> np.ndarray:
    """Indices (into `client_ids`) of the clients that may participate in round `round_num`."""
    round_num = _validation.check_nonnegative_int(round_num, 'round_num')
    last = self._last_round
    ok = (last == _NEVER) | (round_num - last >= self._min_sep)
    if self._max_participations is not None:
      ok &= self._num_participations < self._max_participations
    return np.flatnonzero(ok)

  def sample(self, round_num: int) -> List[str]:
    """Draws the cohort of round `round_num` (must be the next round) and records it.

    The eligible clients with the fewest participations so far (the most left under the cap) come
    first: whole tiers of equally many participations while they fit, then a uniform draw without
    replacement within the next tier. Without a cap all eligible clients form one tier: the draw is
    uniform without replacement over the eligible pool.

    Returns:
      `clients_per_round` client ids: the whole tiers' in `client_ids` order, then the drawn ones
      in the order drawn.

    Raises:
      ValueError: if `round_num` is not the next round, or past the `num_rounds` it was built for.
      RuntimeError: if fewer eligible clients remain than `clients_per_round`: only after a
        `load_state` from which no sampler could fill the round (the schedule was checked when the
        sampler was built).
    """
    round_num = _validation.check_nonnegative_int(round_num, 'round_num')
    if round_num != self._next_round:
      raise ValueError(f'`round_num` must be the next round {self._next_round}, got '
                       f'{round_num}.')
    if self._num_rounds is not None and round_num >= self._num_rounds:
      raise ValueError(f'`round_num`={round_num}: the sampler was built for `num_rounds`='
                       f'{self._num_rounds} rounds (0 .. {self._num_rounds - 1}).')
    pool = self.eligible(round_num)
    m = self._clients_per_round
    if pool.size < m:
      raise RuntimeError(
          f'Round {round_num}: only {pool.size} clients are eligible (min_sep={self._min_sep}, '
          f'max_participations={self._max_participations}), {m} needed.')
    # Fewest participations first finishes whenever any choice of the eligible clients could.
    # An eligible client that is not drawn stays eligible, so eligible clients with equally many
    # participations are interchangeable, and only the tiers drawn from matter. Exchange: take a
    # complete continuation that draws A in round t but not B, both eligible, B with at least as
    # many participations left; A's rounds x_0 = t < x_1 < ... < x_p, B's t < y_1 < ... < y_q.
    # If q <= p, B takes the x's (p + 1 <= A's left <= B's left) and A the y's. Else let i be the first in 0..p with
    # x_{i+1} >= y_{i+1} + b (or i = p); B takes x_0..x_i, y_{i+2}..y_q and A takes
    # y_1..y_{i+1}, x_{i+1}..x_p: the same rounds, q participations for B and p + 1 for A, and
    # y_{i+2} >= x_i + b because y_{i+2} >= y_i + 2b while x_i < y_i + b by the choice of i
    # (i = 0: y_2 >= y_1 + b > t + b). Exchanging until round t draws the fewest participations
    # first, then doing the same for the later rounds, turns any complete schedule into this one.
    if self._max_participations is None:
      sure, tier = pool[:0], pool
    else:
      done = self._num_participations[pool]
      cutoff = np.partition(done, m - 1)[m - 1]  # the participations of the m-th client in line
      sure, tier = pool[done < cutoff], pool[done == cutoff]
    rng = np.random.default_rng([self._seed, round_num])
    chosen = np.concatenate([sure, rng.choice(tier, size=m - sure.size, replace=False)])
    self._last_round[chosen] = round_num
    self._num_participations[chosen] += 1
    self._next_round = round_num + 1
    return [self._client_ids[i] for i in chosen]

  def __repr__(self) -> str:
    k = self._max_participations
    return (f'ClientSampler(num_clients={len(self._client_ids)}, clients_per_round='
            f'{self._clients_per_round}, min_sep={self._min_sep}, max_participations={k}, '
            f'seed={self._seed})')

