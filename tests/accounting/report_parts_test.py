"""Tests for `dp_ftrl_tff.accounting.report_parts`: typed findings, and a report section added the
way a new one is added (issue 37: "adding a report field = the section builder, its renderer, its
test").

The toy section below is a whole new section: its builder (data and findings from the report's
inputs), its renderer (report.md lines) and this test, in this ONE file; `report_parts.registered`
stands for the one `register` call a library section makes. report.json, report.md, the typed
findings and the binaries' warnings pick it up without touching report.py, report_render.py or
report_markdown.py. (A field added to a built-in section touches its builder's module, its
renderer in report_markdown.py and its test: report.json serializes the section's dataclass.)
"""

import json

import pytest

from dp_ftrl_tff import plan
from dp_ftrl_tff.accounting import report, report_parts, report_render
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import tree

pytestmark = pytest.mark.unit


def _build_rounds_per_epsilon(inputs: report_parts.SectionInputs):
  """The toy section's builder: the rounds per unit of epsilon, and a note when it is below 1."""
  rate = inputs.num_rounds / inputs.headline.epsilon
  findings = [] if rate >= 1 else [report_parts.note(
      'rounds_per_epsilon', f'fewer than one round per unit of epsilon ({rate:.3g}).')]
  return {'rounds': inputs.num_rounds, 'rounds_per_epsilon': rate}, findings


def _render_rounds_per_epsilon(data) -> list:
  """The toy section's renderer."""
  return ['## Rounds per epsilon', f"- {data['rounds_per_epsilon']:.4g} rounds per unit of "
          'epsilon.']


TOY = report_parts.Section('rounds_per_epsilon', _build_rounds_per_epsilon,
                           _render_rounds_per_epsilon)


def _plan(noise_multiplier=1.0, rounds=4):
  return plan.RunPlan.for_accounting(
      tree.TreeStrategy('vanilla'), noise_multiplier, num_rounds=rounds,
      participation=participation_lib.ParticipationSchema(1, rounds))


def test_a_registered_section_reaches_json_markdown_and_findings():
  with report_parts.registered(TOY):
    result = report.build_report(_plan(0.5))
  rate = 4 / result.guarantee.epsilon
  assert rate < 1
  assert result.sections == ((TOY, {'rounds': 4, 'rounds_per_epsilon': rate}),)
  finding = report_parts.Finding('rounds_per_epsilon', 'note',
                                 f'fewer than one round per unit of epsilon ({rate:.3g}).')
  assert result.findings_of('rounds_per_epsilon') == (finding,)
  assert result.notes == (finding.text,) and result.warnings == ()
  out = json.loads(report_render.to_json(result))
  assert out['rounds_per_epsilon'] == {'rounds': 4, 'rounds_per_epsilon': rate}
  assert out['findings'] == [finding.to_dict()]
  md = report_render.to_markdown(result)
  section = md.split('## Rounds per epsilon')[1]
  assert f'{rate:.4g} rounds per unit of epsilon' in section
  assert f'- Note: {finding.text}' in section
  assert finding.text not in md.split('## Rounds per epsilon')[0]  # listed in its own section


def test_a_section_is_gone_after_its_with_block_and_adds_nothing_when_quiet():
  with report_parts.registered(TOY):
    quiet = report.build_report(_plan(50.0))
  assert quiet.findings == () and quiet.sections[0][0] is TOY
  assert report_parts.registered_sections() == ()
  assert '## Rounds per epsilon' in report_render.to_markdown(quiet)  # the report renders it
  assert report.build_report(_plan(50.0)).sections == ()


def test_sections_are_refused_on_name_clashes():
  with report_parts.registered(TOY):
    with pytest.raises(ValueError, match="`section` '(rounds_per_epsilon|noise)' is already registered"):
      report_parts.register(TOY)
  with pytest.raises(ValueError, match="`section` '(rounds_per_epsilon|noise)' is already registered"):
    report_parts.register(report_parts.Section('noise', TOY.build, TOY.markdown))
  clash = report_parts.Section('epsilon', lambda inputs: ({}, []), lambda data: [])
  with report_parts.registered(clash):
    result = report.build_report(_plan())
  with pytest.raises(ValueError, match="registered section 'epsilon' has the name of a key"):
    report_render.to_dict(result)
  with pytest.raises(ValueError, match='`section` must be a report_parts.Section'):
    report_parts.register('toy')


@pytest.mark.parametrize('kwargs, name', [
    (dict(section='', severity='note', text='x'), 'section'),
    (dict(section='noise', severity='error', text='x'), 'severity'),
    (dict(section='noise', severity='note', text=''), 'text'),
])
def test_findings_validate_their_fields(kwargs, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    report_parts.Finding(**kwargs)


def test_built_in_findings_are_typed_by_section():
  fixed = report.build_report(plan.RunPlan.build(
      tree.TreeStrategy('vanilla'), 1.0, 2, 1.0, num_rounds=4,
      participation=participation_lib.ParticipationSchema(1, 4), noise_seed_fixed=True))
  (finding,) = fixed.findings
  assert (finding.section, finding.severity) == ('guarantee', 'warning')
  assert 'TESTING ONLY' in finding.text
  assert json.loads(report_render.to_json(fixed))['findings'] == [finding.to_dict()]
