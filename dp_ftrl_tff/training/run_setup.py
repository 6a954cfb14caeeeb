"""A driver run's plan: its strategy (resolved, or the one a resumed run saved), the `RunPlan`, and
the run files that record them.

`run_strategy(config)` returns the strategy of a run: on resume the one saved in the run directory
(`mechanism.json` / `.npz`) with the source the run's `plan.json` recorded; otherwise
`mechanisms.resolve.resolve_strategy` from `--mechanism`, `--mechanism_file` or the mechanism's
options (optimized for the run's setting where the mechanism needs it), with the same checks as every
other entry point (a strategy file made for another setting is refused unless
`--allow_strategy_setting_mismatch`). `build_plan(config, resolved, population)` makes the
`RunPlan` (calibrated to `--target_epsilon` if given), which holds the run's setting, so the report,
the console and `experiments.privacy_report --plan` read everything from it. `write_run_files`
writes `hparams.json`, the strategy and `plan.json`. Nothing here trains.
"""

import json
import os
from typing import Optional, Tuple

from absl import logging

from dp_ftrl_tff import _atomic, auditing, plan_checks
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.accounting import amplified_strategy, calibration
from dp_ftrl_tff.mechanisms import base, files, registry, resolve
from dp_ftrl_tff.training import run_config, run_dir

_MECHANISM_BASENAME = 'mechanism'
_SAVED_STRATEGY_REMEDY = ('restore it (the run\'s noise was drawn with this strategy), or start a '
                          'new run with another --experiment_name.')
_PLAN_REMEDY = ('delete it: the run rewrites it from hparams.json and the mechanism file (both '
                'checked); or start a new run with another --experiment_name.')


def saved_strategy_path(output_dir: str) -> Optional[str]:
  """The strategy file a run saved in `output_dir`, or None."""
  for suffix in registry.FILE_SUFFIXES:
    path = os.path.join(output_dir, _MECHANISM_BASENAME + suffix)
    if os.path.exists(path):
      return path
  return None


def _saved_plan_source(output_dir: str) -> Optional[resolve.StrategySource]:
  """The strategy source the run's `plan.json` recorded (None in plans of earlier releases).

  Raises:
    run_dir.CorruptRunFileError: `plan.json` is not a JSON object.
  """
  path = os.path.join(output_dir, run_dir.PLAN_FILE)
  if not os.path.exists(path):
    return None
  document = run_dir.read_json(path, _PLAN_REMEDY)
  if not isinstance(document, dict):
    raise run_dir.corrupt_file_error(path, 'not a JSON object', _PLAN_REMEDY)
  source = document.get('strategy_source')
  return None if source is None else resolve.StrategySource.from_config(source)


def run_strategy(config: run_config.RunConfig, output_dir: Optional[str] = None,
                 recorded_plan: Optional[dict] = None
                 ) -> Tuple[resolve.ResolvedStrategy, Optional[str]]:
  """(the run's strategy and its source, the run directory's strategy file it was loaded from or
  None when it still has to be saved there), writing nothing. On resume, `recorded_plan` is the
  plan the latest checkpoint's record holds (`checkpoint_records`): the saved strategy's source
  comes from it, not from plan.json. Without `output_dir` (no run directory) the strategy is
  resolved from the settings.

  Raises:
    ValueError: a strategy of another kind than `mechanism`, a file for another setting, ...
    resolve.StrategyFileError (a ValueError): the user's `mechanism_file` cannot be read.
    run_dir.CorruptRunFileError: the run directory's mechanism file or plan cannot be read.
  """
  saved = None if output_dir is None else saved_strategy_path(output_dir)
  if saved is None:
    resolved = resolve.resolve_strategy(
        config.mechanism, strategy=config.mechanism_file, options=config.mechanism_options,
        num_rounds=config.rounds, participation=config.participation,
        allow_setting_mismatch=config.allow_strategy_setting_mismatch)
    logging.info('Mechanism (%s): %s', resolved.source.describe(), resolved.strategy)
    return resolved, None
  if recorded_plan is None:
    source = _saved_plan_source(output_dir)
  else:
    recorded_source = recorded_plan.get('strategy_source')
    source = None if recorded_source is None else resolve.StrategySource.from_config(
        recorded_source)
  try:
    strategy = files.load_strategy(saved)
  except (ValueError, OSError) as error:
    raise run_dir.corrupt_file_error(saved, error, _SAVED_STRATEGY_REMEDY) from error
  if strategy.name != config.mechanism:
    raise ValueError(f'`mechanism_file` {saved!r} holds a {strategy.name!r} strategy, but '
                     f'`mechanism`={config.mechanism}.')
  logging.info('Mechanism (run directory): %s', strategy)
  return resolve.ResolvedStrategy(strategy, source or resolve.StrategySource(
      'file', path=saved, sha256=files.file_sha256(saved))), saved


def build_plan(config: run_config.RunConfig, resolved: resolve.ResolvedStrategy,
               population: int, saved_strategy: Optional[str] = None) -> plan_lib.RunPlan:
  """The run's `RunPlan` over `population` training clients, calibrated to `target_epsilon` when
  given. A Poisson `sampler` draws from the `population`: the plan's `sampling`, whose expected
  cohort size is the plan's `clients_per_round`. The plan records the `population` (any sampler)
  and whether the noise seed was fixed (`noise_seed` given: a testing-only run), for the report and
  the console.

  Raises:
    plan_checks.StrategyTooShortError: the strategy covers fewer rounds (one loaded from the run
      directory's `saved_strategy` file: with the remedies of a run directory).
  """
  if population is None:  # the plan checks a given one
    raise ValueError('`population` (the number of training clients) is required.')
  settings = config.plan_settings(population)
  try:
    plan = plan_lib.RunPlan(
        strategy=resolved.strategy, noise_multiplier=config.noise_multiplier or 0.0,
        clients_per_round=config.clients_per_round, clip_norm=config.clip_norm, **settings,
        beyond_max_rounds=config.banded_beyond_max_rounds, num_rounds=config.rounds,
        participation=config.participation, target_delta=config.target_delta,
        strategy_source=resolved.source, population=population,
        noise_seed_fixed=config.noise_seed is not None)
  except plan_checks.StrategyTooShortError as error:
    if saved_strategy is None:
      raise
    raise error.with_context(f' in {saved_strategy}', 'a new `experiment_name`') from None
  if config.target_epsilon is not None:
    plan = calibration.calibrate_plan(plan, target_epsilon=config.target_epsilon)
    logging.info('Noise multiplier %.6g calibrated to epsilon=%g at delta=%g.',
                 plan.noise_multiplier, config.target_epsilon, config.target_delta)
  warning = (amplification_warning(plan.strategy, plan.sampling, config.rounds)
             if plan.sampling.random_cohorts else None)
  if warning is not None:
    logging.warning('%s', warning)
  return plan


def amplification_warning(strategy: base.Strategy, sampling: sampling_lib.Sampling,
                          num_rounds: Optional[int] = None) -> Optional[str]:
  """Why the random sampling cannot amplify the strategy's privacy, or None when it can.

  Amplification by (cyclic) Poisson sampling covers strategies whose C has at most b-hat bands
  (BandMF paper Sec. 7, docs/papers.md; `amplified_strategy.num_bands`): then the rounds of one
  group share no noise with the other groups. Any other strategy is accounted without amplification
  (with the min-sep schema the sampler enforces). Over `num_rounds` rounds (default: the strategy's
  own, else b-hat + 1, enough to see a band past b-hat).
  """
  num_rounds = num_rounds or strategy.max_rounds or sampling.num_groups + 1
  bands = amplified_strategy.num_bands(strategy, num_rounds)
  if bands is not None and bands <= sampling.num_groups:
    return None
  detail = ('it is not banded' if bands is None or 1 < bands == num_rounds else
            f'its {bands} bands exceed the {sampling.num_groups} sampling groups')
  return (f'{sampling.kind} sampling cannot amplify the privacy of the {strategy.name} strategy '
          f'({detail}): the run trains, and its privacy is accounted without amplification.')


def check_plan_file(output_dir: str) -> None:
  """Raises `run_dir.CorruptRunFileError` if `output_dir`'s `plan.json` is not valid JSON."""
  _saved_plan_source(output_dir)


def hparams_json(config: run_config.RunConfig, run_id: Optional[str] = None) -> str:
  """The text of `hparams.json`: `run_config.hparams_document(config)` and the run's identity
  `run_id` (`run_config.RUN_ID_KEY`; a resume checks the settings, not the identity, against it)
  as sorted, indented JSON."""
  document = run_config.hparams_document(config)
  if run_id is not None:
    document[run_config.RUN_ID_KEY] = auditing.check_run_id(run_id, 'run_id')
  return json.dumps(document, indent=2, sort_keys=True)


def write_run_files(config: run_config.RunConfig, output_dir: str,
                    resolved: resolve.ResolvedStrategy, plan: plan_lib.RunPlan,
                    saved_strategy: Optional[str], run_id: str) -> None:
  """Writes `hparams.json` (with the run's identity `run_id`), the strategy (first start only:
  `mechanism.json` / `.npz` with the setting it was made for, which a resumed run reuses) and
  `plan.json`, each atomically."""
  os.makedirs(output_dir, exist_ok=True)
  _atomic.write_text(os.path.join(output_dir, run_dir.HPARAMS_FILE),
                     hparams_json(config, run_id))
  if saved_strategy is None:  # a resumed run reuses the strategy its first start saved
    path = os.path.join(output_dir,
                        _MECHANISM_BASENAME + registry.entry(resolved.strategy.name).file_suffix)
    files.save_strategy(resolved.strategy, path, setting=resolved.source.setting)
  _atomic.write_text(os.path.join(output_dir, run_dir.PLAN_FILE), plan_lib.plan_json(plan))
