"""What a privacy report's sections are made of: typed findings and the section contract.

A `Finding` is one remark of a section (`section`, `severity`, `text`): report.json carries them
typed under `findings`, report.md renders the warnings first and each section's remarks in its
section, the binaries print the warnings on stderr. Each section builder of `report` returns its
data and its findings; `report.build_report` composes them.

A `Section` is a section added beside the built-in ones (`register` or, in tests, `registered`): its
`build` returns its data and findings from the report's `SectionInputs`, its data goes into
report.json under its `name`, and `markdown` renders it in report.md after the built-in sections.
Adding a section is one module (the builder and its renderer), one `register` call and its test.
"""

import dataclasses
from typing import Any, Callable, List, Optional, Tuple

from dp_ftrl_tff import _registry, _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import zcdp
from dp_ftrl_tff.mechanisms import participation as participation_lib

SEVERITIES = ('warning', 'note')
#: The built-in sections findings belong to, in report.md's order.
SECTIONS = ('guarantee', 'participation', 'mechanism', 'noise', 'secure_aggregation',
            'amplification', 'empirical')


@dataclasses.dataclass(frozen=True)
class Finding:
  """One remark of a report section.

  Attributes:
    section: the section it belongs to (`SECTIONS`, or a registered `Section`'s name).
    severity: 'warning' (the guarantee is void, conservative or doubtful: read it before launching)
      or 'note' (a remark that is not a warning).
    text: the remark, one sentence or a few, without a prefix.
  """
  section: str
  severity: str
  text: str

  def __post_init__(self):
    if not isinstance(self.section, str) or not self.section:
      raise ValueError(f'`section` must be a non-empty str, got {self.section!r}.')
    _validation.check_one_of(self.severity, 'severity', SEVERITIES)
    if not isinstance(self.text, str) or not self.text:
      raise ValueError(f'`text` must be a non-empty str, got {self.text!r}.')

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def warning(section: str, text: str) -> Finding:
  return Finding(section, 'warning', text)


def note(section: str, text: str) -> Finding:
  return Finding(section, 'note', text)


@dataclasses.dataclass(frozen=True)
class SectionInputs:
  """What a registered section's builder reads: the report's plan, its participation log (or
  None), its headline `zcdp.Guarantee`, the headline's rounds n and participation schema."""
  plan: plan_lib.RunPlan
  log: Optional[log_lib.ParticipationLog]
  headline: zcdp.Guarantee
  num_rounds: int
  schema: participation_lib.ParticipationSchema


@dataclasses.dataclass(frozen=True)
class Section:
  """A report section beside the built-in ones.

  Attributes:
    name: its report.json key (not one of report.json's own keys).
    build: `SectionInputs` -> (its JSON-ready data, a list of `Finding`s).
    markdown: its data -> report.md lines (a '## ...' heading first).
  """
  name: str
  build: Callable[[SectionInputs], Tuple[Any, List[Finding]]]
  markdown: Callable[[Any], List[str]]


_REGISTERED = _registry.Registry('section', Section, 'report_parts.Section',
                                 reserved_names=SECTIONS)
#: Adds a section to every report built from now on (after the registered ones; ValueError for a
#: taken name, the built-in sections' included); the same for the duration of a `with` block.
register, registered = _REGISTERED.register, _REGISTERED.registered
#: The registered sections, in registration order.
registered_sections = _REGISTERED.entries
