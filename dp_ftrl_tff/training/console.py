"""The drivers' console: results and progress on stdout, notices on stderr, absl logs on request.

stdout of a driver run:
  * a header from the run's plan: data, mechanism, noise multiplier, clip (fixed, or adaptive with
    its target quantile), the noise seed (a fixed --noise_seed is flagged: testing only), the
    sampler with clients per round, sampling probability and population, rounds, min_sep and the
    planned epsilon at --target_delta for the declared participation (`print_header`);
  * one line per round (`round_log_line`): loss, accuracy, round time, ETA;
  * an eval line every --eval_every rounds (`eval_line`) with the epsilon spent so far, from the
    participation observed in the log up to that round (`spent_guarantee`,
    `zcdp.guarantee_for_plan` on the log's realized schema: one sensitivity and a closed-form
    conversion, no report); while no client participated twice it says so instead of a min_sep;
  * a final summary: the privacy report's summary and the run directory's files (`summary`).
stderr: notices (resume, SecAgg wrap summary `wrap_summary`; `notice`), warnings (a round whose
secure sum wrapped: `modular_wrap_warning`), and the one-line errors. absl INFO
logs (mechanism, segments, ...) come back with `--verbosity=0` (absl's flag; the default here is
WARNING). Imports no TensorFlow.
"""

import datetime
import math
import os
import sys
from typing import Dict, List, Optional

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log, zcdp

#: (epsilon, delta) conversion of the console lines: the exact Gaussian tradeoff curve, a closed form
#: (microseconds; the report's PLD takes seconds at large rho and agrees with it to about 1e-8
#: relative, far below the 4 digits printed). Above `zcdp_epsilon.MAX_RHO` a plan's guarantee is the
#: zCDP bound in every conversion, as in the report, and the lines say it is an upper bound
#: (`epsilon_words`).
CONVERSION = 'gaussian'


def epsilon_words(guarantee: zcdp.Guarantee) -> str:
  """'epsilon 1.234', or for the zCDP conversion bound 'epsilon <= 1531 (an upper bound from
  rho-zCDP, not a tight PLD epsilon)'."""
  if guarantee.epsilon_is_zcdp_bound:
    return (f'epsilon <= {guarantee.epsilon:.4g} (an upper bound from rho-zCDP, not a tight PLD '
            'epsilon)')
  return f'epsilon {guarantee.epsilon:.4g}'


def program_name() -> str:
  """The binary's name in its messages: its file's name (`run_emnist.py`, `mechanisms_cli.py`), or
  its package's for a package run as `python -m PACKAGE` (`workers`)."""
  path = sys.argv[0] if sys.argv and sys.argv[0] else 'dp_ftrl_tff'
  if os.path.basename(path) == '__main__.py':
    return os.path.basename(os.path.dirname(path))
  return os.path.basename(path)


def warn(message: str) -> None:
  """`<program>: warning: <message>` on stderr: the one warning format of every binary and run."""
  print(f'{program_name()}: warning: {message}', file=sys.stderr, flush=True)


def notice(message: str) -> None:
  """One plain line on stderr (no absl prefix), shown at every verbosity."""
  print(message, file=sys.stderr, flush=True)


def out(text: str) -> None:
  """Text on stdout, flushed (progress must show while a run trains)."""
  print(text, flush=True)


def _format_duration(seconds: float) -> str:
  return str(datetime.timedelta(seconds=int(round(seconds))))


def round_log_line(round_num: int, num_rounds: int, loss: float, accuracy: float,
                   round_seconds: float, eta_seconds: float) -> str:
  """One progress line: 1-based round counter, loss, accuracy, round time and ETA."""
  return (f'round {round_num + 1:>{len(str(num_rounds))}}/{num_rounds}  loss {loss:.4f}  '
          f'accuracy {accuracy:.4f}  round {round_seconds:.2f} s  ETA {_format_duration(eta_seconds)}')


def modular_wrap_warning(round_num: int, num_rounds: int, secure_bits: int,
                         modclip_prob: float) -> str:
  """The warning logged for a round whose secure sum wrapped around the 2^bits field."""
  return (f'Round {round_num + 1}/{num_rounds}: the secure sum wrapped around the 2^{secure_bits} '
          'field (modular_wrap=1): this round\'s aggregate is corrupted, and the privacy guarantee '
          f'assumes no wrap. Increase --secure_bits (now {secure_bits}) or lower '
          f'--secure_modclip_prob (now {modclip_prob:g}); see docs/aggregators.md, '
          '"Choosing bits, beta and modclip_prob".')


def wrap_summary(wrap_rounds: List[int], start_round: int, num_rounds: int,
                 secure_bits: int) -> str:
  """The SecAgg line after training rounds `start_round`..`num_rounds`-1: how many of them wrapped
  (`wrap_rounds`, 0-based), shown 1-based."""
  return (f'SecAgg: modular wraps (secure sum outside the 2^{secure_bits} field) in '
          f'{len(wrap_rounds)} of the {num_rounds - start_round} rounds {start_round + 1}-'
          f'{num_rounds}' + (f': rounds {[r + 1 for r in wrap_rounds]}.' if wrap_rounds else '.'))


def spent_guarantee(plan: plan_lib.RunPlan, log_path: str,
                    rounds_done: int) -> Optional[zcdp.Guarantee]:
  """The guarantee of the first `rounds_done` rounds for the participation observed in the run's
  log at `log_path` in those rounds (None without noise or without rows). The log may hold later
  rounds (train_model draws the next round before it releases this one's row)."""
  if plan.noise_multiplier == 0 or rounds_done < 1:
    return None
  log = participation_log.read_participation_log(log_path).first_rounds(rounds_done)
  if not log.num_rows:
    return None
  return zcdp.guarantee_for_plan(plan, rounds_done, log.realized_schema(rounds_done),
                                 conversion=CONVERSION)


#: Noise-to-signal ratio per coordinate (`noise_to_signal`) above which the header warns: at 8.9
#: (the tiny EMNIST model, noise multiplier 1, 10 clients per round) its loss rises over the first
#: rounds; without noise it falls.
NOISE_TO_SIGNAL_WARNING = 3.0


def noise_to_signal(plan: plan_lib.RunPlan, num_params: int) -> float:
  """The noise on one coordinate of a round's mean update against the largest signal there, as for
  the Gaussian mechanism: the noise's standard deviation sigma * clip / m over clip / sqrt(d), the
  per-coordinate size of a clipped update spread over the model's d = `num_params` parameters, i.e.
  sigma * sqrt(d) / m (m: clients per round, expected with random sampling)."""
  return plan.value_noise_multiplier * math.sqrt(num_params) / plan.clients_per_round


def _noise_warning(plan: plan_lib.RunPlan, num_params: Optional[int]) -> List[str]:
  """The header's warning line when the noise dwarfs the mean update (with the fixes)."""
  if num_params is None or not plan.clients_per_round or plan.value_noise_multiplier == 0:
    return []
  ratio = noise_to_signal(plan, num_params)
  if ratio <= NOISE_TO_SIGNAL_WARNING:
    return []
  cohort = math.ceil(ratio / NOISE_TO_SIGNAL_WARNING * plan.clients_per_round)
  return [f'warning     noise {ratio:.3g}x the update per coordinate (noise multiplier '
          f'{plan.value_noise_multiplier:.3g} x sqrt({num_params} parameters) / '
          f'{plan.clients_per_round:g} clients per round): the loss may rise, not fall. To see the '
          f'model learn, use >= {cohort} clients per round (--clients_per_round or '
          '--sampling_prob), a smaller model, or --noise_multiplier=0 to check the pipeline '
          '(no privacy).']


def print_header(plan: plan_lib.RunPlan, data: str, population: int, output_dir: str,
                 num_params: int) -> None:
  """Prints the header of a run in `output_dir` of `plan` over `population` training clients of
  `data` (the task's name), with the plan's guarantee (`zcdp.planned_guarantee` in
  `CONVERSION`; beyond `zcdp_epsilon.MAX_RHO` the zCDP bound, flagged: no noise multiplier is
  refused for the accountant's memory) and a model of `num_params` parameters; before the process
  is built (TFF takes most of the start-up, 10-20 s, to build it)."""
  planned = (None if plan.noise_multiplier == 0 else
             zcdp.planned_guarantee(plan, conversion=CONVERSION))
  out(header(plan, planned, f'{data}: {population} training clients', output_dir, num_params))


def header(plan: plan_lib.RunPlan, guarantee: Optional[zcdp.Guarantee], data: str,
           output_dir: str, num_params: Optional[int] = None) -> str:
  """The run's header (a few lines): what determines the model and its privacy `guarantee` (the
  plan's `zcdp.planned_guarantee` in `CONVERSION`, None without noise); `data` describes the
  training data (e.g. 'synthetic: 1000 training clients'); with the model's `num_params`, a
  warning when the noise dwarfs the mean update (`noise_to_signal`)."""
  sigma = f'{plan.noise_multiplier:.6g}'
  if plan.calibration is not None:
    (target, value), = plan.calibration.items()
    sigma += f' (calibrated to {target[len("target_"):]}={value:g} at delta={plan.target_delta:g})'
  if plan.value_noise_multiplier != plan.noise_multiplier:
    sigma += f', value noise multiplier {plan.value_noise_multiplier:.6g}'
  clip = (f'{plan.clip_norm:g} (fixed)' if plan.adaptive_clip is None else
          f'{plan.clip_norm:g} (initial; adaptive to the unclipped quantile '
          f'{plan.adaptive_clip.target_unclipped_quantile:g})')
  k = plan.participation.max_participations
  planned = ('none (noise multiplier 0)' if guarantee is None else
             f'{epsilon_words(guarantee)} at delta {guarantee.delta:g} (rho-zCDP '
             f'{guarantee.rho:.4g}, declared participation, no amplification)')
  restarts = plan.planned_segments.restart_rounds
  lines = [
      f'data        {data}',
      f'mechanism   {plan.mechanism}'
      + (f', restarts at rounds {_short_list(restarts)}' if restarts else ''),
      f'noise       noise multiplier {sigma}, clip {clip}'
      + (f', SecAgg {plan.secure.bits} bits' if plan.secure else ''),
      f'schedule    {_cohorts(plan)}, {plan.num_rounds} rounds, '
      f'min_sep {plan.participation.min_sep}, max_participations {"none" if k is None else k}'
      + _population(plan),
      f'planned     {planned}',
      f'seed        {_seed(plan)}',
      f'output      {output_dir}',
      *_noise_warning(plan, num_params),
  ]
  return '\n'.join(lines)


#: The header's seed line for a fixed noise seed (`RunPlan.noise_seed_fixed`).
FIXED_SEED_TEXT = ('FIXED noise seed (--noise_seed): TESTING ONLY, the noise is reproducible and '
                   'the run has no privacy guarantee')


def _seed(plan: plan_lib.RunPlan) -> str:
  """The header's noise seed: fixed (testing only), secret, or not recorded."""
  return {True: FIXED_SEED_TEXT, False: 'noise seed drawn from OS entropy (secret)',
          None: 'noise seed not recorded in the plan'}[plan.noise_seed_fixed]


def _cohorts(plan: plan_lib.RunPlan) -> str:
  """The cohorts of the header: the min-sep sampler's fixed count, or the random sampling (its
  sampling probability q)."""
  sampling = plan.sampling
  if not sampling.random_cohorts:
    return (f'{sampling.kind.replace("_", "-")} sampler, {plan.clients_per_round:g} clients per '
            'round')
  groups = f', {sampling.num_groups} groups' if sampling.kind == 'cyclic_poisson' else ''
  return (f'{sampling.kind} sampling q={sampling.sampling_prob:g}{groups}, expected '
          f'{plan.clients_per_round:.4g} clients per round')


def _population(plan: plan_lib.RunPlan) -> str:
  """The header's population and the fraction of it in a round ('' when not recorded)."""
  if plan.population is None:
    return ''
  return (f'; population {plan.population} clients ({plan.clients_per_round / plan.population:.3g} '
          'of them per round)')


def _short_list(values, limit: int = 6) -> str:
  values = list(values)
  text = ', '.join(str(v) for v in values[:limit])
  return text + (f', ... ({len(values)} in all)' if len(values) > limit else '')


def eval_line(rounds_done: int, num_rounds: int, metrics: Dict[str, float],
              guarantee: Optional[zcdp.Guarantee]) -> str:
  """An evaluation line: the `eval_*` metrics and the epsilon spent after `rounds_done` rounds."""
  values = '  '.join(f'{name[len("eval_"):]} {value:.4f}' for name, value in sorted(metrics.items())
                     if name.startswith('eval_'))
  spent = ('no DP guarantee' if guarantee is None else
           f'{epsilon_words(guarantee).replace("epsilon", "epsilon spent", 1)} at delta '
           f'{guarantee.delta:g} (observed '
           f'participation: {_observed(guarantee.participation)})')
  return f'eval  after round {rounds_done}/{num_rounds}  {values}  {spent}'


def _observed(schema) -> str:
  """The realized participation of an eval line. A log in which no client participated twice
  has the schema min_sep = rounds so far, k = 1: no separation realized, so it is said in words."""
  if schema.max_participations == 1:
    return 'no client participated twice yet'
  return f'min_sep {schema.min_sep}, max_participations {schema.max_participations}'


def summary(output_dir: str, report_summary: Optional[str] = None) -> str:
  """The final summary: the privacy report's summary (and where report.md is) and the run
  directory's files."""
  lines = []
  if report_summary:
    report_md = os.path.join(output_dir, 'privacy_report', 'report.md')
    lines += [f'privacy report ({report_md}):', *('  ' + line for line in report_summary.splitlines())]
  lines.append(f'run directory {output_dir}:')
  for name in sorted(os.listdir(output_dir)):
    path = os.path.join(output_dir, name)
    if os.path.isdir(path):
      lines.append(f'  {name}/  ({len(os.listdir(path))} entries)')
    else:
      lines.append(f'  {name}  ({os.path.getsize(path)} bytes)')
  return '\n'.join(lines)
