"""Help texts and docs say what the binaries do: the mechanism lists of the docs are the registry's,
an option's help names only mechanisms the binary accepts, the docs' `amplified` commands run, the
exit codes and error lines the docs quote are the binaries', and a --flagfile that
cannot be read or includes itself is one error line (exit 2). In-process, without TFF."""

import os
import re
import shlex

import pytest
from absl import flags

from dp_ftrl_tff.mechanisms import registry
from experiments.cli import flag_parsing, plan_flags
from tests.testing import binaries

pytestmark = pytest.mark.unit

DOCS = os.path.join(binaries.ROOT, 'docs')
_SH_BLOCK = re.compile(r'^```(?:sh|bash|shell)\n(.*?)^```', re.M | re.S)


def _read(name: str) -> str:
  with open(os.path.join(binaries.ROOT, name), encoding='utf-8') as f:
    return f.read()


def _documents() -> list:
  if not os.path.isdir(DOCS):  # Bazel's runfiles hold no docs/
    pytest.skip('no docs/ here')
  return ['README.md'] + sorted(os.path.join('docs', n) for n in os.listdir(DOCS)
                                if n.endswith('.md'))


def _commands(text: str) -> list:
  """The command lines of the document's shell blocks (backslash continuations joined)."""
  lines = []
  for block in _SH_BLOCK.findall(text):
    lines += block.replace('\\\n', ' ').splitlines()
  return [line.split(' #')[0].strip() for line in lines if line.strip()
          and not line.lstrip().startswith('#')]


# --- mechanism lists ---

#: The documents with a `--mechanism=a|b|...` list, and the binaries' names each must list.
MECHANISM_LISTS = {
    'docs/training.md': lambda: registry.names(streaming_only=True),  # the drivers' --mechanism
    'docs/privacy_report.md': registry.names,  # privacy_report's --mechanism
}


def test_every_mechanism_list_of_the_docs_is_the_binaries():
  found = {}
  for name in _documents():
    for listed in re.findall(r'--mechanism=([a-z_0-9]+(?:\|[a-z_0-9]+)+)', _read(name)):
      found.setdefault(name, []).append(listed.split('|'))
  assert set(found) == set(MECHANISM_LISTS), found
  for name, lists in found.items():
    for listed in lists:
      assert listed == list(MECHANISM_LISTS[name]()), (name, listed)


def test_report_json_mechanism_row_names_every_mechanism():
  row = next(line for line in _read('docs/privacy_report.md').splitlines()
             if line.startswith('| `mechanism` |'))
  assert set(registry.names()) <= set(re.findall(r'`([a-z_]+)`', row)), row


# --- option help ---

def _applies_to(help_text: str) -> list:
  match = re.search(r'Applies to: ([a-z_0-9, ]+)\.', help_text)
  return match.group(1).split(', ') if match else []


def test_a_drivers_option_help_names_only_driver_mechanisms():
  from experiments import privacy_report
  from experiments.emnist import run_emnist
  assert _applies_to(run_emnist.FLAGS['completion'].help) == ['tree', 'tree_efficient']
  assert 'tree_full' in _applies_to(privacy_report.FLAGS['completion'].help)
  streaming = set(registry.names(streaming_only=True))
  for name in registry.option_table():
    assert set(_applies_to(run_emnist.FLAGS[name].help)) <= streaming, name


def test_an_option_of_no_mechanism_of_the_binary_says_so():
  offline = registry.Mechanism(
      'offline_only', 'offline test mechanism', 'dp_ftrl_tff.mechanisms.tree:TreeStrategy', None,
      parameter_options=(registry.Option('offline_knob', 'bool', 'Offline knob.'),))
  with registry.registered(offline):
    fv = flags.FlagValues()
    plan_flags.define_mechanism_flags(fv, streaming_only=True)
    everything = flags.FlagValues()
    plan_flags.define_mechanism_flags(everything)
  assert 'none of the mechanisms' in fv['offline_knob'].help, fv['offline_knob'].help
  assert _applies_to(everything['offline_knob'].help) == ['offline_only']


# --- the docs' `amplified` commands ---


def test_docs_amplified_commands_run():
  commands = [c for name in _documents() for c in _commands(_read(name))
              if c.startswith('python -m experiments.mechanisms_cli amplified')]
  assert commands
  for command in commands:
    code, _, stderr = binaries.run_in_process(binaries.MECH, shlex.split(command)[3:])
    assert code == 0, (command, stderr)


# --- docs/privacy_report.md's exit codes and error line ---

def test_privacy_report_md_quotes_the_binarys_exit_code_and_error_line(tmp_path):
  text = ' '.join(_read('docs/privacy_report.md').split())
  (tmp_path / 'plan.json').write_text('not json\n')
  documented = int(re.search(r'a plan file that is not JSON exits (\d)', text).group(1))
  code, _, stderr = binaries.run_in_process(binaries.REPORT, [f'--plan={tmp_path}/plan.json'])
  assert code == documented, stderr
  assert 'exit with status 2' in text
  line, flag = re.search(r'for example `(privacy_report\.py: error: [^`]+)` \(for `(--[^`]+)`\)',
                         text).groups()
  code, _, stderr = binaries.run_in_process(binaries.REPORT, [flag])
  assert (code, stderr) == (2, line + '\n')


# --- --flagfile errors ---

@pytest.mark.parametrize('module, program', [
    (binaries.EMNIST, 'run_emnist.py'), (binaries.REPORT, 'privacy_report.py'),
    (binaries.MECH, 'mechanisms')])
def test_flagfile_that_cannot_be_read_is_one_line_naming_it(tmp_path, module, program):
  missing = tmp_path / 'missing.cfg'
  command = ['evaluate'] if module == binaries.MECH else []
  code, _, stderr = binaries.run_in_process(module, [*command, f'--flagfile={missing}'])
  assert code == 2, stderr
  assert stderr == (f'{program}: error: --flagfile={missing}: cannot read it: No such file or '
                    'directory.\n')
  # An included file: named, with the file that includes it.
  (tmp_path / 'top.cfg').write_text(f'# settings\n--flagfile={missing}\n')
  code, _, stderr = binaries.run_in_process(module, [*command, f'--flagfile={tmp_path}/top.cfg'])
  assert code == 2, stderr
  assert stderr == (f'{program}: error: --flagfile={missing} (included by {tmp_path}/top.cfg): '
                    'cannot read it: No such file or directory.\n')


@pytest.mark.parametrize('module, program', [
    (binaries.EMNIST, 'run_emnist.py'), (binaries.REPORT, 'privacy_report.py'),
    (binaries.MECH, 'mechanisms')])
def test_circular_flagfile_is_refused_in_one_line(tmp_path, module, program):
  a, b = tmp_path / 'a.cfg', tmp_path / 'b.cfg'
  a.write_text(f'--flagfile={b}\n')
  b.write_text(f'--rounds=3\n--flagfile={a}\n')
  command = ['evaluate'] if module == binaries.MECH else []
  code, _, stderr = binaries.run_in_process(module, [*command, f'--flagfile={a}'])
  assert code == 2, stderr
  assert stderr == (f'{program}: error: --flagfile={a} includes itself ({a} -> {b} -> {a}); '
                    'remove the --flagfile line that closes the circle.\n')
  a.write_text(f'--flagfile={a}\n')  # directly, and as `--flagfile F` on the command line
  code, _, stderr = binaries.run_in_process(module, [*command, '--flagfile', str(a)])
  assert code == 2 and f'includes itself ({a} -> {a})' in stderr, stderr


def test_flagfile_included_twice_without_a_circle_is_accepted(tmp_path):
  # a includes b and c, both include d: absl reads d twice, which is no circle.
  for name, lines in {'a': ['b', 'c'], 'b': ['d'], 'c': ['d']}.items():
    (tmp_path / f'{name}.cfg').write_text(''.join(f'--flagfile={tmp_path}/{x}.cfg\n' for x in lines))
  (tmp_path / 'd.cfg').write_text('--rounds=3\n')
  flag_parsing.check_flagfiles(['prog', f'--flagfile={tmp_path}/a.cfg'])
  flag_parsing.check_flagfiles(['prog', '--', f'--flagfile={tmp_path}/missing.cfg'])  # after --
  with pytest.raises(flag_parsing.FlagfileError, match='missing.cfg'):
    flag_parsing.check_flagfiles(['prog', f'-flagfile={tmp_path}/missing.cfg'])
