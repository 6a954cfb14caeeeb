"""--eval_every in the train_model program (`experiments.programs.program_evaluation`), in-process.

The EMNIST driver and the program on the same settings evaluate the same rounds with equal values
in the same metrics rows and print the same eval lines; a run killed with an evaluation in flight
and a run whose evaluation failed resume to the uninterrupted run's rows. Tiny settings
(`tests.testing.runs.tiny_config`: 30 synthetic clients, 3 per round, a 1-buffer BLT).
"""

import asyncio
import os
import shutil

import numpy as np
import pytest
import tensorflow_federated as tff

from experiments.emnist import run_emnist
from experiments.programs import emnist_program, program_evaluation
from experiments.run import checkpoint_records, evaluation, training_loop
from tests.testing import run_files, runs

pytestmark = pytest.mark.integration

TASK = {'model': 'tiny', 'only_digits': True}
PROGRAM_TASK = {**TASK, 'program': emnist_program.PROGRAM}
BLT = dict(mechanism='blt', mechanism_options={'num_buffers': 1})


def _eval_lines(capfd):
  return [line for line in capfd.readouterr().out.splitlines()
          if line.startswith('eval  after round')]


def _evaluated_rows(config):
  return [i for i, row in enumerate(run_files.metrics_rows(config.output_dir))
          if row.get('eval_loss')]


@pytest.mark.slow  # about 35 s: a driver and a program run of 5 rounds, and a resumed round
def test_the_driver_and_the_program_evaluate_every_k_rounds_identically(tmp_path, capfd):
  # --eval_every=2 over 5 rounds: the driver evaluates after rounds 2, 4 and 5 (the last), and the
  # program through train_model's EvaluationManager (concurrent with training) the same rounds, with
  # the driver's evaluation code: equal `eval_<metric>` values in the same rows (0-based 1, 3, 4),
  # the same console eval lines (the epsilon spent from the log's rounds so far only: the program
  # has logged the next round already). Then a kill after round 5's row but before its checkpoint,
  # with round 5's evaluation in flight in EvaluationManager's state (checkpoints/eval/): the rerun
  # resumes from checkpoint 4, evaluates round 5 once and ends with the uninterrupted metrics.csv.
  common = dict(**BLT, rounds=5, eval_every=2, checkpoint_every=2)
  driver = runs.tiny_config(tmp_path / 'driver', task=TASK, **common)
  program = runs.tiny_config(tmp_path / 'program', task=PROGRAM_TASK, **common)
  capfd.readouterr()
  training_loop.run(run_emnist.build_task(driver), driver)
  lines = [_eval_lines(capfd)]
  result = emnist_program.run(emnist_program.build_task(program), program)
  lines.append(_eval_lines(capfd))
  driver_rows = [{k: v for k, v in row.items() if k != 'cohort_size'}
                 for row in run_files.metrics_rows(driver.output_dir)]
  program_rows = run_files.metrics_rows(program.output_dir)
  assert _evaluated_rows(driver) == [1, 3, 4]
  assert program_rows == driver_rows
  assert result['metrics'] == {k: float(v) for k, v in program_rows[-1].items() if k != 'round'}
  assert len(lines[0]) == 3 and lines[1] == lines[0]
  out = program.output_dir
  # No evaluation left in flight: only EvaluationManager's (empty) list of them.
  assert os.listdir(program_evaluation.eval_dir(out)) == ['eval_manager']

  metrics = run_files.read_bytes(os.path.join(out, 'metrics.csv'))
  shutil.rmtree(checkpoint_records.checkpoint_path(out, 5))
  os.remove(checkpoint_records.record_path(out, 5))
  in_flight = os.path.join(program_evaluation.eval_dir(out), 'evaluation_of_train_round_00005')
  os.makedirs(os.path.join(in_flight, program_evaluation.EVAL_PREFIX + '0'))
  state = tff.program.FileProgramStateManager(
      os.path.join(program_evaluation.eval_dir(out), 'eval_manager'),
      prefix=program_evaluation.EVAL_PREFIX)
  asyncio.run(state.save((np.array([5], np.int32), np.array([1], np.int32)), version=99))
  emnist_program.run(emnist_program.build_task(program), program)
  assert len(_eval_lines(capfd)) == 1
  assert run_files.read_bytes(os.path.join(out, 'metrics.csv')) == metrics


@pytest.mark.slow  # about 25 s: a program run of 2 rounds, then its resume
def test_a_failed_evaluation_stops_the_program_before_its_checkpoint(tmp_path, monkeypatch):
  # The evaluation of round 2 fails (a full disk, in EvaluationManager's background task): the
  # program raises it (the row waiting for it does not hang), saves no checkpoint of round 2 or
  # later and writes no row of round 2; the rerun resumes from checkpoint 1, past the failed
  # evaluation's state left in checkpoints/eval/, and evaluates rounds 2 and 4.
  config = runs.tiny_config(tmp_path, task=PROGRAM_TASK, **BLT, rounds=4, eval_every=2)
  real, calls = evaluation.evaluate, []

  def evaluate(*args):
    calls.append(args)
    if len(calls) == 1:
      raise OSError(28, 'No space left on device')
    return real(*args)

  monkeypatch.setattr(evaluation, 'evaluate', evaluate)
  with pytest.raises(OSError, match='No space left'):
    emnist_program.run(emnist_program.build_task(config), config)
  checkpoints = os.listdir(checkpoint_records.checkpoints_dir(config.output_dir))
  assert sorted(n for n in checkpoints if n.startswith('program_state_')) == [
      'program_state_0', 'program_state_1']
  assert [row['round'] for row in run_files.metrics_rows(config.output_dir)] == ['0']
  emnist_program.run(emnist_program.build_task(config), config)
  assert _evaluated_rows(config) == [1, 3]
  assert len(calls) == 3
