"""Every flag of every binary, given one invalid value, is named in the binary's one-line error.

Runs each binary's own parsing and validation in-process (the path its `main` takes before any
training): the drivers' `config_from_flags` then `training_loop.train`'s setup, the privacy
report's and the mechanisms CLI's `main`. The invalid value comes from the flag's type (`_invalid_value`),
or from `INVALID` where the type allows no generic one.
"""

import contextlib
import io

import pytest
import tensorflow_federated as tff
from absl import flags

from experiments import mechanisms_cli, privacy_report
from experiments.cli import flag_parsing
from experiments.emnist import run_emnist
from experiments.run import driver
from experiments.stackoverflow import run_stackoverflow

pytestmark = pytest.mark.unit

#: Flags whose type admits no generic invalid value: the value to give instead.
INVALID = {
    'mechanism': 'dpsgd',
    'mechanism_file': '/nonexistent/strategy.json',
    'plan': '/nonexistent/plan.json',
    'participation_log': '/nonexistent/participation.csv',
    'metrics': '/nonexistent/metrics.csv',
    'canaries': '/nonexistent/canaries.json',
    'data': '/nonexistent/data.sqlite',
    'word_counts': '/nonexistent/word_counts.txt',
    'root_output_dir': '/proc/no_such_dir',
    'output_dir': '/proc/no_such_dir',
    'output': '/proc/no_such_dir/strategy.json',
    'experiment_name': '../escape',
    'workers': 'no-port',
    'restart_rounds': '-1',
}
#: Flags with no invalid value at all (free text, or every value is meaningful).
NO_INVALID_VALUE = {
    'help', 'helpfull', 'helpshort', 'helpxml',
}

TINY_DRIVER = ['--model=tiny', '--rounds=2', '--clients_per_round=3',
               '--synthetic_num_clients=30', '--synthetic_examples_per_client=8', '--min_sep=2',
               '--eval_max_examples=16']


def _invalid_value(flag) -> str:
  if flag.name in INVALID:
    return INVALID[flag.name]
  kind = flag.flag_type()
  if kind == 'bool':
    return 'maybe'
  if kind in ('int', 'float'):
    return '-7'
  if kind in ('enum', 'string enum'):
    return 'bogus'
  if kind in ('multi_int', 'list', 'multi string', 'multi'):
    return 'x'
  return 'bogus'


def _parse(fv: flags.FlagValues, argv) -> None:
  fv.unparse_flags()
  fv(argv, known_only=True)


def _driver_error(module, argv, tmp_path) -> str:
  fv = module.FLAGS
  try:
    _parse(fv, ['driver', f'--root_output_dir={tmp_path}', *TINY_DRIVER, *argv])
    driver.run_from_flags(fv, module.build_task, module.task_settings)
  except flags.Error as error:
    return flag_parsing.error_line(error, fv)
  except driver.Failure as failure:
    return flag_parsing.error_line(failure.error, fv)
  finally:
    fv.unparse_flags()
  return 'accepted'


def _main_error(fv, main, argv, parse=True) -> str:
  stderr = io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
      if parse:
        _parse(fv, argv)
        code = main(argv[:1])
      else:
        code = main(argv)
  except flags.Error as error:
    return flag_parsing.error_line(error, fv)
  finally:
    fv.unparse_flags()
  return stderr.getvalue().strip() if code else 'accepted'


def _cases(name, fv):
  own = [f for f in fv.flags_by_module_dict().values() for f in f]
  seen = set()
  for flag in own:
    if flag.name in seen or flag.name in NO_INVALID_VALUE:
      continue
    seen.add(flag.name)
    yield pytest.param(name, flag.name, _invalid_value(flag), id=f'{name}:{flag.name}')


CASES = [*_cases('run_emnist', run_emnist.FLAGS),
         *_cases('run_stackoverflow', run_stackoverflow.FLAGS),
         *_cases('privacy_report', privacy_report.FLAGS),
         *_cases('mechanisms', mechanisms_cli._FLAGS)]  # pylint: disable=protected-access


@pytest.fixture(autouse=True)
def _context_kept():
  """A binary's `main` or `run` leaves the caller's TFF context in place (the tests after this one
  train in this process)."""
  before = tff.framework.get_context_stack().current
  yield
  assert tff.framework.get_context_stack().current is before


@pytest.mark.parametrize('binary,flag,value', CASES)
def test_invalid_value_names_the_flag(binary, flag, value, tmp_path):
  given = f'--{flag}={value}'
  line = _error_line(binary, given, tmp_path)
  assert '\n' not in line
  assert f'--{flag}' in line, f'{binary} {given}: {line}'


def _error_line(binary, given, tmp_path) -> str:
  if binary in ('run_emnist', 'run_stackoverflow'):
    module = run_emnist if binary == 'run_emnist' else run_stackoverflow
    return _driver_error(module, [given], tmp_path)
  elif binary == 'privacy_report':
    return _main_error(privacy_report.FLAGS, privacy_report.main,
                       ['privacy_report', '--mechanism=gaussian', '--noise_multiplier=1',
                        '--rounds=10', '--min_sep=1', given])
  else:
    line = _main_error(mechanisms_cli._FLAGS, mechanisms_cli.main,  # pylint: disable=protected-access
                       ['mechanisms', 'evaluate', '--mechanism=gaussian', '--rounds=10',
                        '--min_sep=1', given], parse=False)
  return line
