"""Tests of the sweep's grid spellings and point names (experiments/sweeps/sweep_grid.py)."""

import json

import pytest

from experiments.sweeps import sweep_grid

pytestmark = pytest.mark.unit


def test_grid_text_is_the_cartesian_product_in_order():
  points = sweep_grid.parse_grid_text('noise_multiplier=0.5,1.0; mechanism=blt,banded')
  assert points == [(('noise_multiplier', '0.5'), ('mechanism', 'blt')),
                    (('noise_multiplier', '0.5'), ('mechanism', 'banded')),
                    (('noise_multiplier', '1.0'), ('mechanism', 'blt')),
                    (('noise_multiplier', '1.0'), ('mechanism', 'banded'))]
  assert sweep_grid.point_name(points[1]) == 'noise_multiplier=0.5,mechanism=banded'
  assert sweep_grid.point_flags(points[1]) == ['--noise_multiplier=0.5', '--mechanism=banded']


def test_grid_document_union_of_products_without_duplicates(tmp_path):
  document = [{'mechanism': ['blt'], 'num_buffers': [2, 3]}, {'mechanism': ['gaussian']},
              {'mechanism': ['blt'], 'num_buffers': [2]}, {'adaptive_clipping': [True]}]
  path = tmp_path / 'grid.json'
  path.write_text(json.dumps(document))
  assert sweep_grid.load_grid_file(str(path)) == [
      (('mechanism', 'blt'), ('num_buffers', '2')), (('mechanism', 'blt'), ('num_buffers', '3')),
      (('mechanism', 'gaussian'),), (('adaptive_clipping', 'true'),)]


@pytest.mark.parametrize('text, match', [
    ('', 'non-empty'), ('noise_multiplier', 'lacks "="'), ('a=1;a=2', 'twice'),
    ('a=1,,2', 'empty value'), ('root_output_dir=/x', 'sweep sets it'),
    ('experiment_name=x', 'sweep sets it'), ('9a=1', 'not a flag name')])
def test_bad_grid_text_names_the_problem(text, match):
  with pytest.raises(ValueError, match=match):
    sweep_grid.parse_grid_text(text)


@pytest.mark.parametrize('document, match', [
    ({}, 'non-empty JSON object'), ([], 'non-empty JSON object'), ({'a': []}, 'non-empty list'),
    ({'a': 1}, 'non-empty list'), ({'a': [None]}, 'not a number'), ({'a': [[1]]}, 'not a number')])
def test_bad_grid_document_names_the_problem(document, match):
  with pytest.raises(ValueError, match=match):
    sweep_grid.parse_grid_document(document)


def test_unreadable_grid_file_names_it(tmp_path):
  path = tmp_path / 'bad.json'
  path.write_text('{not json')
  with pytest.raises(ValueError, match='bad.json.*not valid JSON'):
    sweep_grid.load_grid_file(str(path))
  with pytest.raises(ValueError, match='cannot read'):
    sweep_grid.load_grid_file(str(tmp_path / 'missing.json'))


def test_unsafe_characters_and_name_collisions():
  a = (('mechanism_file', '/data/blt a.json'),)
  assert sweep_grid.point_name(a) == 'mechanism_file=_data_blt_a.json'
  b = (('mechanism_file', '/data/blt_a.json'),)
  with pytest.raises(ValueError, match='share the run directory name'):
    sweep_grid.check_unique_names([a, b])
  sweep_grid.check_unique_names([a, (('mechanism_file', 'other'),)])
