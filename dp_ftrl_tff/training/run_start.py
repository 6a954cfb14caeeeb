"""The start of a run (`dp_ftrl_tff.training.training_loop`).

`start_run` is the one set-up of a run: it locks the run directory, checks a resume against its
checkpoint's record (`dp_ftrl_tff.training.checkpoint_records`), resolves the strategy and builds the
plan (`dp_ftrl_tff.training.run_setup`), sets up the canary clients
(`dp_ftrl_tff.training.canary_clients`), prints the header (`dp_ftrl_tff.training.console.print_header`) and
builds the DP-FTRL process from the plan, writing nothing. `SetupError` is how it refuses to start
(`setup_errors` turns the ValueErrors of a start into it, in the flags' words). A stop signal is
seen between these steps (`dp_ftrl_tff.training.stop_signals.check`) and inside the strategy's optimizer
and the plan's calibration (`dp_ftrl_tff.stopping`).
"""

import contextlib
import dataclasses
import secrets
from typing import Any, List, Optional

import tensorflow_federated as tff

from dp_ftrl_tff import aggregators, sampling
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.learning import canaries as canaries_lib
from dp_ftrl_tff.learning import dp_ftrl
from dp_ftrl_tff.mechanisms import memory, resolve
from dp_ftrl_tff.training import (
  canary_clients,
  checkpoint_records,
  console,
  model_checks,
  record_checks,
  run_config,
  run_dir,
  run_setup,
  stop_signals,
)
from dp_ftrl_tff.training import task as task_lib


class SetupError(ValueError):
  """A run cannot start (bad settings, impossible schedule, mismatched run directory or mechanism,
  an execution context without secure sums); raised before any training. The drivers print it as
  one line on stderr. Its message names the settings as `RunConfig` (and the flags) does."""


@contextlib.contextmanager
def setup_errors(*errors):
  """Turns the ValueErrors (and `errors`, e.g. SecAgg context errors) of a run's set-up into
  `SetupError`, in the flags' words."""
  try:
    yield
  except SetupError:
    raise
  except (ValueError, *errors) as error:
    raise SetupError(run_config.field_words(str(error))) from error


@dataclasses.dataclass(frozen=True)
class RunStart:
  """What a run starts from, checked before anything is written: its plan, the strategy behind it
  (`saved_strategy`: the run directory's file it was loaded from, None until it is saved there),
  where it resumes (`resumption`), the run files to rebuild from the verified settings
  (`record_checks.check_files`), the population's
  `client_ids` (the task's training clients, then the `canary_ids`), the run's `canaries` (None
  without), the DP-FTRL `process` (`learning.dp_ftrl`) and the run's identity `run_id` (the
  checkpoint record's when it resumes, else a new one: `new_run_id`)."""
  plan: plan_lib.RunPlan
  resolved: resolve.ResolvedStrategy
  saved_strategy: Optional[str]
  resumption: checkpoint_records.Resumption
  rebuild: List[str]
  client_ids: List[str]
  canary_ids: List[str]
  canaries: Optional[canaries_lib.Canaries]
  process: Any
  run_id: str


def new_run_id() -> str:
  """A new run's identity: 128 random bits as 32 hex digits (`auditing.RUN_ID_PATTERN`)."""
  return secrets.token_hex(16)


def start_run(task: task_lib.Task, config: run_config.RunConfig,
              directory: run_dir.RunDirectory) -> RunStart:
  """Locks the run directory, then checks everything and builds the plan over the task's training
  clients and the run's canary clients, the canaries, the header and the process, writing
  nothing. The process is built before any
  execution context is chosen: building runs no computation. Between the steps, a recorded stop
  signal raises `stop_signals.Interrupted`.

  Raises:
    ValueError: other settings than the checkpoint's record, a strategy or plan that does not fit.
    run_dir.RunDirError: the directory is in use, or a run file is corrupt or differs from the
      record.
  """
  train_ids = list(task.train_data.client_ids)
  population = len(train_ids) + config.canary_clients
  # Cohorts the sampler cannot draw are the user's settings: refused before the directory is read.
  sampling.sampler_class(config.sampler).check_cohorts(
      population, config.clients_per_round, config.participation, config.rounds)
  # The lock first, then every check (reading only); nothing is written before they pass.
  directory.acquire()
  directory.end_stale_workers()
  stop_signals.check()
  # A resumed run is checked against its checkpoint's record, never against hparams.json or
  # plan.json alone (they may be gone or replaced; they are rewritten from the record's settings).
  output_dir = directory.path
  resumption = checkpoint_records.find_resumption(output_dir)
  rebuild = record_checks.check_files(output_dir, resumption)
  record_checks.check_settings(resumption, config, output_dir)
  stop_signals.check()
  resolved, saved_strategy = run_setup.run_strategy(
      config, output_dir, resumption.record and resumption.record['plan'])
  stop_signals.check()
  plan = run_setup.build_plan(config, resolved, population, saved_strategy)
  stop_signals.check()
  record_checks.check_plan(resumption, checkpoint_records.plan_document(plan))
  # The noise state's buffers are model-sized: a mechanism option that makes too many of them is
  # refused before TFF allocates them (`memory.check_noise_state_fits`).
  num_params = model_checks.check_model_fits_data(task)
  memory.check_noise_state_fits(plan.strategy, config.rounds, num_params)
  canary_ids, canaries = canary_clients.run_canaries(train_ids, config.canary_clients,
                                                     config.seed, plan)
  console.print_header(plan, task.name, population, output_dir, num_params)
  stop_signals.check()
  process = dp_ftrl.build_dp_ftrl_process(
      task.model_fn, tff.learning.optimizers.build_sgdm(config.client_learning_rate),
      aggregator=aggregators.CorrelatedNoiseFactory(plan, noise_seed=config.noise_seed),
      # DP-FTRLM's server optimizer: SGD with heavy-ball momentum.
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(
          learning_rate=config.server_learning_rate, momentum=config.server_momentum or None),
      canaries=canaries,
      # DP-FTRLM resets the server momentum where a new correlated segment starts.
      restart_rounds=plan.planned_segments.restart_rounds if plan.strategy.correlated else ())
  stop_signals.check()
  return RunStart(plan, resolved, saved_strategy, resumption, rebuild,
                  train_ids + canary_ids, canary_ids, canaries, process,
                  resumption.run_id or new_run_id())
