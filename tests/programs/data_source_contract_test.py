"""TFF's data source contract applied to `dp_ftrl_tff.programs.data_source`.

The cases follow TFF 0.87's `DatasetDataSourceTest` / `DatasetDataSourceIteratorTest` and
`ClientIdDataSource`: init type and value errors, `federated_type`, `select` returns k items,
`select` TypeError for a non-int k and ValueError for None, negative or too large k, and
`from_bytes(to_bytes())` is a new, equal iterator. Documented differences: a wrong-typed argument
raises `DataSourceTypeError`, both a TypeError (TFF's contract) and a ValueError (the project's); a
min-sep iterator accepts only k = `clients_per_round` (so k = 0 is invalid for it); the settings
come from a run plan (its own checks are tests/plan_test.py's).
"""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.learning import poisson_sampler
from dp_ftrl_tff.mechanisms import blt
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.programs import data_source

pytestmark = pytest.mark.unit

IDS = [f'client-{i:02d}' for i in range(12)]
POISSON = sampling_lib.Sampling('poisson', 0.5, 1, len(IDS))
CYCLIC = sampling_lib.Sampling('cyclic_poisson', 0.9, 3, len(IDS))
BLT = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2))


def _kwargs(tmp_path, *, clients_per_round=3, min_sep=2, max_participations=None,
            num_rounds=None, **overrides):
  """The constructor's keywords of a min-sep plan."""
  plan = plan_lib.RunPlan.build(
      BLT, 1.0, clients_per_round, 1.0, num_rounds=num_rounds,
      participation=participation_lib.ParticipationSchema.b_min_sep(min_sep, max_participations))
  return dict(plan=plan, participation_log=str(tmp_path / 'participation.csv'), seed=5) | overrides


def _poisson_kwargs(tmp_path, sampling):
  return dict(plan=plan_lib.RunPlan.build(BLT, 1.0, None, 1.0, sampling=sampling),
              participation_log=str(tmp_path / 'participation.csv'), seed=5)


def _client_data(ids):
  return tff.simulation.datasets.TestClientData(
      {c: collections.OrderedDict(x=np.zeros([1], np.float32)) for c in ids})


CLASSES = [data_source.SampledClientDataSource, data_source.SampledClientDataSourceIterator]


@pytest.mark.parametrize('cls', CLASSES)
@pytest.mark.parametrize('population', [IDS, tuple(IDS), _client_data(IDS)],
                         ids=['list', 'tuple', 'client_data'])
def test_init_does_not_raise_type_error(tmp_path, cls, population):
  made = cls(population, **_kwargs(tmp_path))
  assert made.client_ids == tuple(IDS)


@pytest.mark.parametrize('cls', CLASSES)
@pytest.mark.parametrize('population', [None, True, 1, 'a', [True, 1, 'a'], b'ab',
                                        tff.program.ClientIdDataSource(IDS)])
def test_init_raises_type_error_with_population(tmp_path, cls, population):
  with pytest.raises(TypeError, match='population'):
    cls(population, **_kwargs(tmp_path))
  with pytest.raises(ValueError, match='population'):  # the project's convention too
    cls(population, **_kwargs(tmp_path))


@pytest.mark.parametrize('cls', CLASSES)
@pytest.mark.parametrize('population, kwargs, match', [
    ([], {}, 'must not be empty'),
    (['a', 'b', 'a', 'c'], dict(clients_per_round=1), 'unique'),
    (IDS, dict(clients_per_round=4, min_sep=4, num_rounds=10), 'Impossible schedule'),
    (IDS, dict(clients_per_round=13), 'clients_per_round'),
    (IDS, dict(seed=-1), 'seed'),
    (IDS, dict(participation_log=''), 'participation_log'),
    (IDS, dict(plan={'clients_per_round': 3}), '`plan`'),
    (IDS[:11], dict(plan=plan_lib.RunPlan.build(BLT, 1.0, None, 1.0, sampling=POISSON)),
     'population'),
])
def test_init_raises_value_error(tmp_path, cls, population, kwargs, match):
  with pytest.raises(ValueError, match=match):
    cls(population, **_kwargs(tmp_path, **kwargs))


def test_init_refuses_a_file_that_is_not_a_log(tmp_path):
  path = tmp_path / 'participation.csv'
  path.write_text('a,b\r\n')
  with pytest.raises(ValueError, match='not a participation log'):
    data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path))


@pytest.mark.parametrize('cls', CLASSES)
def test_init_sets_federated_type(tmp_path, cls):
  made = cls(IDS, **_kwargs(tmp_path))
  assert made.federated_type == tff.FederatedType(np.str_, tff.CLIENTS)
  assert made.federated_type == tff.program.ClientIdDataSource(IDS).federated_type


def test_iterator_is_fresh_and_has_no_side_effects(tmp_path):
  source = data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path))
  first = source.iterator()
  first.select(3)
  log = (tmp_path / 'participation.csv').read_bytes()
  second = source.iterator()
  assert second is not first and second != first
  assert second == source.iterator() and second.next_round == 0
  assert second.federated_type == source.federated_type
  assert (tmp_path / 'participation.csv').read_bytes() == log
  # Constructing the data source again (a program restart) leaves the log alone too.
  data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path))
  assert (tmp_path / 'participation.csv').read_bytes() == log


@pytest.mark.parametrize('k', [1, 2, 3, len(IDS)])
def test_select_returns_ids_with_k(tmp_path, k):
  iterator = data_source.SampledClientDataSource(
      IDS, **_kwargs(tmp_path, clients_per_round=k, min_sep=1)).iterator()
  for _ in range(3):
    result = iterator.select(k)
    assert len(result) == k and len(set(result)) == k and set(result) <= set(IDS)
    assert all(isinstance(c, str) for c in result)


@pytest.mark.parametrize('sampling', [POISSON, CYCLIC], ids=['poisson', 'cyclic'])
@pytest.mark.parametrize('k', [0, 1, 4, len(IDS)])
def test_poisson_select_returns_a_subset_of_the_round_group(tmp_path, sampling, k):
  iterator = data_source.SampledClientDataSource(IDS, **_poisson_kwargs(tmp_path, sampling)
                                                 ).iterator()
  groups = _groups(sampling)
  for t in range(6):
    result = iterator.select(k)
    assert len(set(result)) == len(result)
    assert set(result) <= set(groups[t % sampling.num_groups])


def _groups(sampling):
  sampler = poisson_sampler.PoissonSampler(IDS, sampling, seed=5)
  return [sampler.group(g) for g in range(sampling.num_groups)]


@pytest.mark.parametrize('k', ['a', [], 3.0, True, None.__class__])
def test_select_raises_type_error_with_k(tmp_path, k):
  iterator = data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path)).iterator()
  with pytest.raises(TypeError, match='`k`'):
    iterator.select(k)
  with pytest.raises(ValueError, match='`k`'):
    iterator.select(k)
  assert iterator.next_round == 0


@pytest.mark.parametrize('k', [None, -1, len(IDS) + 1, 2, 4, 0])
def test_select_raises_value_error_with_k(tmp_path, k):
  iterator = data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path)).iterator()
  with pytest.raises(ValueError, match='`k`'):
    iterator.select(k)
  assert iterator.next_round == 0 and iterator.log_offset == len(b'client_id,round\r\n')


@pytest.mark.parametrize('k', [None, -1, len(IDS) + 1])
def test_poisson_select_raises_value_error_with_k(tmp_path, k):
  iterator = data_source.SampledClientDataSource(IDS, **_poisson_kwargs(tmp_path, POISSON)
                                                 ).iterator()
  with pytest.raises(ValueError, match='`k`'):
    iterator.select(k)


def test_select_accepts_numpy_ints(tmp_path):
  iterator = data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path)).iterator()
  assert len(iterator.select(np.int64(3))) == 3


@pytest.mark.parametrize('make', [
    lambda p: data_source.SampledClientDataSource(IDS, **_kwargs(p)),
    lambda p: data_source.SampledClientDataSource(IDS, **_kwargs(p, max_participations=4,
                                                                 num_rounds=10)),
    lambda p: data_source.SampledClientDataSource(IDS, **_poisson_kwargs(p, POISSON)),
    lambda p: data_source.SampledClientDataSource(IDS, **_poisson_kwargs(p, CYCLIC)),
], ids=['min_sep', 'min_sep_capped', 'poisson', 'cyclic_poisson'])
@pytest.mark.parametrize('selects', [0, 3])
def test_serializable(tmp_path, make, selects):
  iterator = make(tmp_path).iterator()
  for _ in range(selects):
    iterator.select(3)
  buffer = iterator.to_bytes()
  assert isinstance(buffer, bytes)
  restored = data_source.SampledClientDataSourceIterator.from_bytes(buffer)
  assert restored is not iterator
  assert type(restored) is data_source.SampledClientDataSourceIterator
  assert restored == iterator
  assert restored.to_bytes() == buffer
  assert restored.next_round == selects
  assert restored.federated_type == iterator.federated_type


def test_equality_sees_every_part(tmp_path):
  source = data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path))
  other_seed = data_source.SampledClientDataSource(IDS, **_kwargs(tmp_path, seed=6))
  other_ids = data_source.SampledClientDataSource(IDS[::-1], **_kwargs(tmp_path))
  other_log = data_source.SampledClientDataSource(
      IDS, **_kwargs(tmp_path, participation_log=str(tmp_path / 'other.csv')))
  base = source.iterator()
  assert base == source.iterator()
  assert all(base != made.iterator() for made in (other_seed, other_ids, other_log))
  advanced = source.iterator()
  advanced.select(3)
  assert base != advanced
  assert base != object()
