"""The finished-run notice says what another --rounds does: a larger one trains on."""

import json
import os

import pytest

from dp_ftrl_tff.training import run_summary
from experiments.run import driver
from tests.testing import runs

pytestmark = pytest.mark.unit


def test_finished_run_notice_says_what_another_rounds_does(tmp_path, capsys):
  says = 'a larger --rounds trains on'
  config = runs.tiny_config(tmp_path)
  os.makedirs(config.output_dir)
  with open(run_summary.summary_path(config.output_dir), 'w') as f:
    json.dump({'format': run_summary.FORMAT, 'rounds': config.rounds}, f)
  assert driver._finished(config)  # pylint: disable=protected-access
  notice = capsys.readouterr().err
  assert says in notice and notice.count('--rounds') == 1, notice
