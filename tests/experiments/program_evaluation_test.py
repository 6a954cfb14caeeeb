"""--eval_every through train_model's EvaluationManager (`dp_ftrl_tff.training.program_evaluation`),
in-process.

A run evaluates the every k-th and the last round, each in its round's metrics row, with the eval
lines on the console; a run killed with an evaluation in flight and a run whose evaluation failed
resume to the uninterrupted run's rows. Tiny settings
(`tests.testing.runs.tiny_config`: 30 synthetic clients, 3 per round, a 1-buffer BLT).
"""

import asyncio
import os
import shutil

import numpy as np
import pytest
import tensorflow_federated as tff

from dp_ftrl_tff.training import checkpoint_records, evaluation, program_evaluation, training_loop
from experiments.emnist import run_emnist
from tests.testing import run_files, runs

pytestmark = pytest.mark.integration

TASK = {'model': 'tiny', 'only_digits': True}
BLT = dict(mechanism='blt', mechanism_options={'num_buffers': 1})


def _eval_lines(capfd):
  return [line for line in capfd.readouterr().out.splitlines()
          if line.startswith('eval  after round')]


def _evaluated_rows(config):
  return [i for i, row in enumerate(run_files.metrics_rows(config.output_dir))
          if row.get('eval_loss')]


@pytest.mark.slow  # about 25 s: a run of 5 rounds, and a resumed round
def test_evaluates_every_k_rounds_and_an_evaluation_in_flight_is_redone_once(tmp_path, capfd):
  # --eval_every=2 over 5 rounds: train_model's EvaluationManager (concurrent with training)
  # evaluates after rounds 2, 4 and 5 (the last), with the drivers' Keras evaluation, each in its
  # round's row (0-based 1, 3, 4), with an eval line on the console (the epsilon spent from the
  # log's rounds so far only: the data source has logged the next round already). Then a kill
  # after round 5's row but before its checkpoint, with round 5's evaluation in flight in
  # EvaluationManager's state (checkpoints/eval/): the rerun resumes from checkpoint 4, evaluates
  # round 5 once and ends with the uninterrupted metrics.csv.
  program = runs.tiny_config(tmp_path, task=TASK, **BLT, rounds=5, eval_every=2,
                             checkpoint_every=2)
  capfd.readouterr()
  result = training_loop.train(run_emnist.build_task(program), program, program.output_dir)
  lines = _eval_lines(capfd)
  rows = run_files.metrics_rows(program.output_dir)
  assert _evaluated_rows(program) == [1, 3, 4]
  final = {k: v for k, v in result['metrics'].items() if k != 'round_seconds'}
  assert final == {k: float(v) for k, v in rows[-1].items() if k != 'round'}
  assert [line.split('epsilon')[0].split()[:5] for line in lines] == [
      ['eval', 'after', 'round', f'{r}/5', 'accuracy'] for r in (2, 4, 5)]
  for line, row in zip(lines, (rows[1], rows[3], rows[4]), strict=True):
    assert f"loss {float(row['eval_loss']):.4f}" in line
  out = program.output_dir
  # No evaluation left in flight: only EvaluationManager's (empty) list of them.
  assert os.listdir(program_evaluation.eval_dir(out)) == ['eval_manager']

  metrics = run_files.metrics_rows(out)
  shutil.rmtree(checkpoint_records.checkpoint_path(out, 5))
  os.remove(checkpoint_records.record_path(out, 5))
  in_flight = os.path.join(program_evaluation.eval_dir(out), 'evaluation_of_train_round_00005')
  os.makedirs(os.path.join(in_flight, program_evaluation.EVAL_PREFIX + '0'))
  state = tff.program.FileProgramStateManager(
      os.path.join(program_evaluation.eval_dir(out), 'eval_manager'),
      prefix=program_evaluation.EVAL_PREFIX)
  asyncio.run(state.save((np.array([5], np.int32), np.array([1], np.int32)), version=99))
  training_loop.train(run_emnist.build_task(program), program, program.output_dir)
  assert len(_eval_lines(capfd)) == 1
  assert run_files.metrics_rows(out) == metrics  # bar the wall times


@pytest.mark.slow  # about 25 s: a run of 2 rounds, then its resume
def test_a_failed_evaluation_stops_the_run_before_its_checkpoint(tmp_path, monkeypatch):
  # The evaluation of round 2 fails (a full disk, in EvaluationManager's background task): the
  # loop raises it (the row waiting for it does not hang), saves no checkpoint of round 2 or
  # later and writes no row of round 2; the rerun resumes from checkpoint 1, past the failed
  # evaluation's state left in checkpoints/eval/, and evaluates rounds 2 and 4.
  config = runs.tiny_config(tmp_path, task=TASK, **BLT, rounds=4, eval_every=2)
  real, calls = evaluation.evaluate, []

  def evaluate(*args):
    calls.append(args)
    if len(calls) == 1:
      raise OSError(28, 'No space left on device')
    return real(*args)

  monkeypatch.setattr(evaluation, 'evaluate', evaluate)
  with pytest.raises(OSError, match='No space left'):
    training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  checkpoints = os.listdir(checkpoint_records.checkpoints_dir(config.output_dir))
  assert sorted(n for n in checkpoints if n.startswith('program_state_')) == [
      'program_state_0', 'program_state_1']
  assert [row['round'] for row in run_files.metrics_rows(config.output_dir)] == ['0']
  training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  assert _evaluated_rows(config) == [1, 3]
  assert len(calls) == 3
