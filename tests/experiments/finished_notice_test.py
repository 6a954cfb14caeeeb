"""The finished-run notice says what another --rounds does: a driver trains on, the train_model
program refuses it (its data source's schedule is in its checkpoints)."""

import json
import os

import pytest

from experiments.run import driver, run_summary
from tests.testing import runs

pytestmark = pytest.mark.unit


@pytest.mark.parametrize('task, says', [
    ({}, 'a larger --rounds trains on'),
    ({'program': 'train_model'}, 'another --rounds is refused'),
])
def test_finished_run_notice_says_what_another_rounds_does(tmp_path, capsys, task, says):
  config = runs.tiny_config(tmp_path, task=task)
  os.makedirs(config.output_dir)
  with open(run_summary.summary_path(config.output_dir), 'w') as f:
    json.dump({'format': run_summary.FORMAT, 'rounds': config.rounds}, f)
  assert driver._finished(config)  # pylint: disable=protected-access
  notice = capsys.readouterr().err
  assert says in notice and notice.count('--rounds') == 1, notice
