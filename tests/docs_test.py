"""Every fenced code block of README.md and docs/**/*.md runs as written.

Blocks, by the fence's language:
  * `python`: run in document order in ONE namespace per document, in a subprocess of the venv's
    Python whose working directory is a fresh temporary directory;
  * `sh`, `bash`, `shell`: run with `bash -e -o pipefail` from the repository root, in document order
    in the same subprocess, with the venv's `bin/` first on PATH (so `python` is the venv's Python);
  * `text` or no language: sample output, not executed (and checked not to hold a command).
Any other language fails the test: label the block.

Executed blocks write under `/tmp/...` in the docs; the test replaces `/tmp/` with its own temporary
directory, so runs never share files and nothing is written into the repository.

Markers (HTML comments, invisible when the markdown is rendered), each on the line right before a
fence unless said otherwise:
  * `<!-- docs-test: skip (reason) -->`: the block is not run and is reported as a skipped test with
    the reason. Only for long runs (training, benchmarks, the test suite itself).
  * `<!-- docs-test: output -->` before a `text` block: every non-blank line of it must be printed, in
    this order, by the closest shell block above it.
  * a hidden Python block, anywhere, run in order with the visible ones (setup a reader already has,
    such as a `model_fn`, or checks of what the visible blocks built):
        <!-- docs-test: python
        ...code...
        -->
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / 'README.md', *(ROOT / 'docs').rglob('*.md')])
PYTHON = ('python',)
SHELL = ('sh', 'bash', 'shell')
OUTPUT = ('', 'text')
TIMEOUT_SECONDS = 900

_FENCE = re.compile(r'^( {0,3})(`{3,}|~{3,})\s*([\w+-]*)\s*$')
_SKIP = re.compile(r'^\s*<!--\s*docs-test:\s*skip\s*\((.+)\)\s*-->\s*$')
_EXPECT = re.compile(r'^\s*<!--\s*docs-test:\s*output\s*-->\s*$')
_HIDDEN_START = re.compile(r'^\s*<!--\s*docs-test:\s*python\s*$')
_HIDDEN_END = re.compile(r'^\s*-->\s*$')
_ANY_MARKER = re.compile(r'docs-test:')
# A line of an output block that is really a command a reader would run.
_COMMAND_LINE = re.compile(r'^\s*(\$ |python3? -m |\.venv/bin/|make |tools/|bazel )')


@dataclasses.dataclass(frozen=True)
class Block:
  document: str  # path relative to the repository root
  line: int  # 1-based line of the opening fence (or of the hidden block's marker)
  language: str  # 'python', 'sh', ..., 'text'; '' for none
  code: str
  skip_reason: str | None = None
  expected_output: bool = False  # a `text` block that the shell block above must print
  hidden: bool = False

  @property
  def where(self) -> str:
    return f'{self.document}:{self.line}'

  @property
  def runs(self) -> bool:
    """Executed (code) or checked (expected output) by `test_document_blocks_run`."""
    if self.skip_reason is not None:
      return False
    return self.language in PYTHON + SHELL or self.expected_output


def extract_blocks(path: pathlib.Path, root: pathlib.Path = ROOT) -> list:
  """Fenced and hidden blocks of a markdown file, in document order."""
  lines = path.read_text().splitlines()
  document = path.relative_to(root).as_posix()
  blocks, i = [], 0
  while i < len(lines):
    if _HIDDEN_START.match(lines[i]):
      start = i
      i += 1
      body = []
      while i < len(lines) and not _HIDDEN_END.match(lines[i]):
        body.append(lines[i])
        i += 1
      if i == len(lines):
        raise ValueError(f'{document}:{start + 1}: hidden block is not closed by "-->"')
      blocks.append(Block(document, start + 1, 'python', '\n'.join(body) + '\n', hidden=True))
      i += 1
      continue
    fence = _FENCE.match(lines[i])
    if not fence:
      if _ANY_MARKER.search(lines[i]) and not (_SKIP.match(lines[i]) or _EXPECT.match(lines[i])):
        raise ValueError(f'{document}:{i + 1}: malformed docs-test marker: {lines[i]!r}')
      i += 1
      continue
    indent, marker, language = len(fence.group(1)), fence.group(2), fence.group(3).lower()
    start = i
    previous = lines[i - 1] if i > 0 else ''
    skip = _SKIP.match(previous)
    i += 1
    body = []
    closing = re.compile(r'^ {0,3}' + re.escape(marker[0]) + '{' + str(len(marker)) + r',}\s*$')
    while i < len(lines) and not closing.match(lines[i]):
      body.append(lines[i][indent:] if lines[i][:indent].strip() == '' else lines[i])
      i += 1
    if i == len(lines):
      raise ValueError(f'{document}:{start + 1}: code block is not closed')
    blocks.append(Block(document, start + 1, language, '\n'.join(body) + '\n',
                        skip_reason=skip.group(1).strip() if skip else None,
                        expected_output=bool(_EXPECT.match(previous))))
    i += 1
  return blocks


def _all_blocks() -> list:
  return [block for path in DOCUMENTS for block in extract_blocks(path)]


# Runs the blocks of one document: Python in one namespace (cwd = the temporary directory), shell
# from the repository root, expected output against the last shell block's stdout. Argument: a JSON
# file {"root": ..., "blocks": [...]}.
_DRIVER = r'''
import json, os, subprocess, sys, time, traceback
spec = json.load(open(sys.argv[1]))
namespace = {'__name__': '__docs__'}
last_output = None
status = 0


def check_output(expected, printed):
  printed_lines = [line.rstrip() for line in printed.splitlines()]
  position = 0
  for line in (l.rstrip() for l in expected.splitlines() if l.strip()):
    try:
      position = printed_lines.index(line, position) + 1
    except ValueError:
      raise AssertionError(f'expected line not printed (in order): {line!r}') from None


try:
  for block in spec['blocks']:
    print(f"--- {block['where']} ({block['kind']})", flush=True)
    start = time.perf_counter()
    try:
      if block['kind'] == 'python':
        exec(compile(block['code'], block['where'], 'exec'), namespace)
      elif block['kind'] == 'shell':
        result = subprocess.run(['bash', '-e', '-o', 'pipefail', '-c', block['code']],
                                cwd=spec['root'], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                text=True)
        print(result.stdout, end='', flush=True)
        result.check_returncode()
        last_output = result.stdout
      else:
        if last_output is None:
          raise AssertionError('expected output without a shell block above it')
        check_output(block['code'], last_output)
    except BaseException:
      traceback.print_exc()
      print(f"FAILED: {block['where']} ({block['kind']})", flush=True)
      status = 1
      break
    print(f"--- {block['where']} took {time.perf_counter() - start:.1f} s", flush=True)
finally:
  if 'tensorflow_federated' in sys.modules:
    from dp_ftrl_tff.learning import worker_processes
    worker_processes.end_child_workers()
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
'''


def _kind(block: Block) -> str:
  if block.language in PYTHON:
    return 'python'
  return 'shell' if block.language in SHELL else 'output'


def _run_document(path: pathlib.Path, tmp_path: pathlib.Path,
                  root: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
  blocks = [b for b in extract_blocks(path, root) if b.runs]
  work = tmp_path / 'work'
  work.mkdir(parents=True)
  spec = {'root': str(root),
          'blocks': [{'where': b.where + (' (hidden)' if b.hidden else ''), 'kind': _kind(b),
                      'code': b.code.replace('/tmp/', f'{tmp_path}/')} for b in blocks]}
  spec_file = tmp_path / 'blocks.json'
  spec_file.write_text(json.dumps(spec))
  env = dict(os.environ)
  env['PATH'] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get('PATH', '')])
  env['PYTHONPATH'] = os.pathsep.join(p for p in [str(ROOT), env.get('PYTHONPATH')] if p)
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  env['MPLBACKEND'] = 'Agg'
  return subprocess.run([sys.executable, '-c', _DRIVER, str(spec_file)], cwd=work, env=env,
                        capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
                        stdin=subprocess.DEVNULL)


_RUN_DOCUMENTS = sorted({b.document for b in _all_blocks() if b.runs})
_SKIPPED = [b for b in _all_blocks() if b.skip_reason is not None]


@pytest.mark.e2e
@pytest.mark.parametrize('document', _RUN_DOCUMENTS)
def test_document_blocks_run(document, tmp_path):
  start = time.perf_counter()
  result = _run_document(ROOT / document, tmp_path)
  elapsed = time.perf_counter() - start
  output = (result.stdout + '\n' + result.stderr)[-8000:]
  assert result.returncode == 0, f'{document}: a code block failed ({elapsed:.0f} s):\n{output}'
  ran = len(re.findall(r'^--- .* took [0-9.]+ s$', result.stdout, re.M))
  expected = sum(b.runs for b in extract_blocks(ROOT / document))
  assert ran == expected, f'{document}: ran {ran} of {expected} blocks:\n{output}'


@pytest.mark.parametrize('block', _SKIPPED, ids=[b.where for b in _SKIPPED])
def test_marked_block_is_skipped(block):
  assert block.language in PYTHON + SHELL, f'{block.where}: only code blocks take a skip marker'
  pytest.skip(f'{block.where}: {block.skip_reason}')


def test_every_block_is_labelled():
  problems = []
  for block in _all_blocks():
    if block.language not in PYTHON + SHELL + OUTPUT:
      problems.append(f'{block.where}: unknown language {block.language!r} '
                      f'(use python, sh, bash, shell or text)')
    elif block.expected_output and block.language != 'text':
      problems.append(f'{block.where}: an expected-output block is a `text` block')
    elif block.language in OUTPUT:
      commands = [line for line in block.code.splitlines() if _COMMAND_LINE.match(line)]
      if commands:
        problems.append(f'{block.where}: output block holds a command {commands[0]!r}; '
                        'label it sh (or split command and output)')
  assert not problems, '\n'.join(problems)


def test_extraction_handles_markers(tmp_path):
  doc = tmp_path / 'x.md'
  doc.write_text('Intro\n\n<!-- docs-test: python\nx = 1\n-->\n\n```python\nprint(x)\n```\n\n'
                 '<!-- docs-test: skip (too slow) -->\n```sh\nmake demo\n```\n\n```\noutput\n```\n'
                 '1. item\n\n   ```sh\n   echo hi\n   ```\n<!-- docs-test: output -->\n'
                 '```text\nhi\n```\n')
  blocks = extract_blocks(doc, root=tmp_path)
  assert [(b.language, b.hidden, b.skip_reason, b.expected_output) for b in blocks] == [
      ('python', True, None, False), ('python', False, None, False),
      ('sh', False, 'too slow', False), ('', False, None, False), ('sh', False, None, False),
      ('text', False, None, True)]
  assert [b.code for b in blocks] == ['x = 1\n', 'print(x)\n', 'make demo\n', 'output\n',
                                      'echo hi\n', 'hi\n']
  assert [b.line for b in blocks] == [3, 7, 12, 16, 21, 25]
  assert [b.runs for b in blocks] == [True, True, False, False, True, True]
  doc.write_text('<!-- docs-test: skipp (typo) -->\n```sh\nls\n```\n')
  with pytest.raises(ValueError, match='malformed docs-test marker'):
    extract_blocks(doc, root=tmp_path)


@pytest.mark.e2e
def test_runner_on_a_small_document(tmp_path):
  doc = tmp_path / 'doc.md'
  doc.write_text('<!-- docs-test: python\nimport pathlib\nx = 41\n-->\n\n'
                 '```python\npathlib.Path("/tmp/x.txt").write_text(str(x + 1))\n```\n\n'
                 '```sh\ncat /tmp/x.txt; echo; echo done\n```\n\n'
                 '<!-- docs-test: output -->\n```text\n42\ndone\n```\n')
  result = _run_document(doc, tmp_path, root=tmp_path)
  assert result.returncode == 0, result.stdout + result.stderr
  assert len(re.findall(r' took [0-9.]+ s$', result.stdout, re.M)) == 4
  assert (tmp_path / 'x.txt').read_text() == '42'  # /tmp/ was replaced by the test's directory
  doc.write_text(doc.read_text().replace('42\ndone', 'done\n42'))
  result = _run_document(doc, tmp_path / 'again', root=tmp_path)
  assert result.returncode == 1
  assert "expected line not printed (in order): '42'" in result.stdout + result.stderr


def _architecture_sections():
  """The module map of docs/ARCHITECTURE.md (from its "## Modules" heading on)."""
  text = (ROOT / 'docs' / 'ARCHITECTURE.md').read_text()
  return text[text.index('## Modules'):]


@pytest.mark.parametrize('package', ['dp_ftrl_tff', 'experiments'])
def test_architecture_names_every_module(package):
  """Every module appears in the module map, in backticks, within its package's section: the
  section whose heading or lead names the folder (e.g. `dp_ftrl_tff.mechanisms`, `experiments/run/`)."""
  doc = _architecture_sections()
  missing = []
  for path in sorted((ROOT / package).rglob('*.py')):
    if path.name == '__init__.py':
      continue
    folder = path.parent.relative_to(ROOT).as_posix()
    dotted = folder.replace('/', '.')
    lead = {'experiments/emnist': '`emnist/`', 'experiments/stackoverflow': '`stackoverflow/`'}
    pattern = (re.escape(lead[folder]) if folder in lead else
               rf'\n### `{re.escape(dotted)}`|\n### `{re.escape(folder)}/`|\n`{re.escape(folder)}/`')
    starts = [m.start() for m in re.finditer(pattern, doc)]
    if not starts:
      missing.append(f'{folder} (no section)')
      continue
    section = doc[starts[0]:]
    following = re.search(r'\n(###|`experiments/[a-z]+/`[,:])', section[1:])
    section = section if following is None else section[:following.start() + 1]
    if f'`{path.name}`' not in section and f'`{path.relative_to(ROOT / folder).as_posix()}`' not in section:
      missing.append(path.relative_to(ROOT).as_posix())
  assert not missing, f'docs/ARCHITECTURE.md does not name: {missing}'
