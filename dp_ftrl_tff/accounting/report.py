"""The privacy report of a training run: its data (`PrivacyReport`) and computation (`build_report`).

`build_report` turns (strategy, rounds, noise multiplier or a calibration target, declared and/or
observed participation, restarts, adaptive clipping, SecAgg) into a `PrivacyReport`:
  * the headline guarantee: rho-zCDP and (epsilon, delta) by PLD (see `zcdp`). With a participation
    log it is computed for the REALIZED participation (realized min_sep and max participations, as the
    Gboard paper's tables are), which holds whatever was declared; a log that breaks the declared
    schema is reported loudly in `warnings`;
  * for trees with a log, also the exact guarantee over the observed clients' actual patterns (the
    tree module's per-client sum of squared node counts);
  * optionally, every mechanism's noise multiplier and losses at the headline's privacy
    (`equal_privacy`), and the strategy file the mechanism came from with its SHA-256, checked
    against the run's setting;
  * with random sampling (`sampling_prob`, `sampling_groups` b-hat: cyclic Poisson, BandMF paper
    Thm. 4, docs/papers.md#bandmf), also the amplified guarantee (`amplification`) next to the
    unamplified headline, which holds whatever the sampling.
Rendering (JSON, terminal summary, the BLT paper's App. C markdown checklist, plots) lives in
`report_render`.

Conventions: rounds 0-based; `min_sep` = b (r2 - r1 >= b) and `min_separation` = b - 1 (TF-Privacy,
Gboard tables; `ParticipationSchema.tf_privacy_min_separation`); noise multipliers are relative to
the clip norm; sensitivities use clip norm 1.
"""

import dataclasses
from typing import List, Optional, Sequence

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import amplification, calibration, zcdp
from dp_ftrl_tff.accounting import equal_privacy as equal_privacy_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.mechanisms import base, files
from dp_ftrl_tff.mechanisms import participation as participation_lib


class StrategySettingMismatchError(ValueError):
  """The strategy file was optimized for another setting than the run's (see `build_report`)."""


@dataclasses.dataclass(frozen=True)
class ObservedParticipation:
  """What a participation log shows.

  Attributes:
    path: the log file.
    num_rows, num_clients, num_rounds: rows, distinct clients, last logged round + 1.
    min_sep: realized b (None: nobody participated twice).
    max_participations: realized k.
    histogram: {participations: clients}.
    violations: breaches of the declared schema (empty: compliant or nothing declared).
    tree_patterns: trees only: {'sensitivity_squared', 'rho', 'epsilon', 'worst_client'} over the
      observed clients' actual patterns, or None.
  """
  path: str
  num_rows: int
  num_clients: int
  num_rounds: int
  min_sep: Optional[int]
  max_participations: int
  histogram: dict
  violations: tuple
  tree_patterns: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
  """A finished privacy report (`report_render` turns it into JSON, markdown and plots).

  Attributes:
    guarantee: the headline `zcdp.Guarantee`.
    mechanism_config: the strategy's `to_config()`.
    participation_source: 'declared' or 'observed' (realized from the log).
    sensitivity_exact: False when sens^2 is an upper bound (BLT outside Thm. 3.1, banded with more
      bands than min_sep, restarts of a non-tree strategy).
    declared: the guarantee under the declared schema when a log was also given, else None.
    observed: `ObservedParticipation` or None.
    clipped_count_stddev: adaptive clipping's sigma_b, or None.
    value_noise_multiplier: the inflated z_Delta the model sum must use with adaptive clipping.
    secure_aggregation: with SecAgg, the chain's settings, each segment's clip and post-rounding
      sensitivity clip, and the rounds whose secure sum wrapped (see `build_report`); else None.
    calibration: {'target_rho': ...} or {'target_epsilon': ...} when sigma was calibrated, else None.
    warnings: loud messages (schema violations, upper bounds, large inflation).
    equal_privacy: `equal_privacy.EqualPrivacy` at the headline's rho and participation, or None.
    strategy_file: {'path', 'sha256', 'setting', 'mismatches'} of the strategy file, or None.
    amplified: the `amplification.AmplifiedGuarantee` under the run's random sampling, or None.
  """
  guarantee: zcdp.Guarantee
  mechanism_config: dict
  participation_source: str
  sensitivity_exact: bool
  declared: Optional[zcdp.Guarantee] = None
  observed: Optional[ObservedParticipation] = None
  clipped_count_stddev: Optional[float] = None
  value_noise_multiplier: Optional[float] = None
  calibration: Optional[dict] = None
  secure_aggregation: Optional[dict] = None
  warnings: tuple = ()
  equal_privacy: Optional[equal_privacy_lib.EqualPrivacy] = None
  strategy_file: Optional[dict] = None
  amplified: Optional[amplification.AmplifiedGuarantee] = None

  @property
  def min_sep(self) -> int:
    return self.guarantee.participation.min_sep

  @property
  def max_participations(self) -> int:
    """Effective k = min(k, ceil(n / b))."""
    g = self.guarantee
    return g.participation.effective_max_participations(g.num_rounds)


def _json_config(config: dict) -> dict:
  """The strategy config with arrays (e.g. banded `band_rows`) summarized by their shape."""
  return {k: (f'<float64 array of shape {list(np.shape(v))}>' if isinstance(v, np.ndarray) else v)
          for k, v in config.items()}


def _check_rounds(strategy, num_rounds: int, restart_rounds) -> int:
  """`num_rounds` as int; every segment between `restart_rounds` must fit `strategy.max_rounds` (a
  banded strategy restarted past its n rounds covers a longer run)."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  restarts = [r for r in (restart_rounds or ()) if 0 < r < num_rounds]
  for length in zcdp.segment_lengths(num_rounds, restarts):
    strategy.check_num_rounds(length)
  return num_rounds


def build_report(strategy: base.Strategy, num_rounds: Optional[int] = None,
                 participation: Optional[participation_lib.ParticipationSchema] = None, *,
                 noise_multiplier: Optional[float] = None, target_epsilon: Optional[float] = None,
                 target_rho: Optional[float] = None, delta: float = zcdp.DEFAULT_DELTA,
                 restart_rounds: Optional[Sequence[int]] = None,
                 log: Optional[log_lib.ParticipationLog] = None,
                 clipped_count_stddev: Optional[float] = None,
                 observed_patterns: bool = True,
                 secure_aggregation: Optional[dict] = None,
                 equal_privacy: bool = False, strategy_file: Optional[str] = None,
                 allow_strategy_setting_mismatch: bool = False,
                 sampling_prob: Optional[float] = None,
                 sampling_groups: Optional[int] = None) -> PrivacyReport:
  """Builds the privacy report of a run.

  Args:
    strategy: the mechanism.
    num_rounds: n; may be omitted with a log (then the log's last round + 1).
    participation: the declared schema; may be omitted with a log.
    noise_multiplier, target_epsilon, target_rho: exactly one. A target calibrates sigma for the
      headline participation.
    delta: in (0, 1).
    restart_rounds: 0-based rounds at which the noise restarts.
    log: a `ParticipationLog`; the headline then uses the realized participation.
    clipped_count_stddev: adaptive clipping's sigma_b (the report adds the value noise multiplier).
    observed_patterns: trees with a log: also the exact guarantee over the observed patterns.
    secure_aggregation: with SecAgg, a dict with the chain's 'bits', 'rotation', 'beta',
      'modclip_prob', 'segments' (one {'segment', 'clip', 'sensitivity_clip'} per noise segment: the
      active clip and the post-rounding L2 bound the noise std was proportional to) and
      'wrap_rounds' (rounds whose secure sum wrapped around the field). A wrap voids the norm bound
      of that round's sum, so each one is a warning.
    equal_privacy: also compare every mechanism at the headline's rho and participation (seconds
      at n = 2000; see `equal_privacy.equal_privacy`).
    strategy_file: the file `strategy` was loaded from: its path, SHA-256 and recorded setting go
      into the report, and a setting other than the run's (its rounds and declared schema; only the
      rounds without a declared schema) is a `StrategySettingMismatchError` naming the differences.
    allow_strategy_setting_mismatch: make that mismatch a warning instead of an error.
    sampling_prob: q in (0, 1] when the cohorts were sampled at random: the probability that a
      member of the round's group participates. Adds the amplified guarantee (the headline stays
      the unamplified one).
    sampling_groups: b-hat >= 1 groups of cyclic Poisson sampling (round t samples group
      t mod b-hat; default 1: Poisson sampling of the whole population). The strategy must be
      lower triangular with at most b-hat bands (ValueError otherwise).
  """
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a mechanisms Strategy, got {strategy!r}.')
  given = [name for name, v in (('noise_multiplier', noise_multiplier),
                                ('target_epsilon', target_epsilon), ('target_rho', target_rho))
           if v is not None]
  if len(given) != 1:
    raise ValueError('Exactly one of `noise_multiplier`, `target_epsilon`, `target_rho` must be '
                     f'given, got {given or "none"}.')
  if participation is not None and not isinstance(participation,
                                                  participation_lib.ParticipationSchema):
    raise ValueError(f'`participation` must be a ParticipationSchema, got {participation!r}.')
  if log is not None and not isinstance(log, log_lib.ParticipationLog):
    raise ValueError(f'`log` must be a ParticipationLog, got {log!r}.')
  if log is None and (participation is None or num_rounds is None):
    raise ValueError('`participation` and `num_rounds` are required without a participation log.')
  if log is not None and log.num_rows == 0:
    raise ValueError('The participation log has no rows.')
  warnings: List[str] = []
  declared_rounds = num_rounds
  if log is None:
    num_rounds = _check_rounds(strategy, num_rounds, restart_rounds)
    schema, source, observed = participation, 'declared', None
  else:
    num_rounds = log.num_rounds if num_rounds is None else _validation.check_positive_int(
        num_rounds, 'num_rounds')
    violations = tuple(log.violations(participation, num_rounds) if participation is not None
                       else (log.violations(participation_lib.ParticipationSchema(), num_rounds)))
    num_rounds = _check_rounds(strategy, max(num_rounds, log.num_rounds), restart_rounds)
    schema, source = log.realized_schema(num_rounds), 'observed'
    warnings.extend(f'participation log violates the declared schema: {v}' for v in violations)
    observed = ObservedParticipation(
        path=log.path, num_rows=log.num_rows, num_clients=log.num_clients,
        num_rounds=log.num_rounds, min_sep=log.min_sep, max_participations=log.max_participations,
        histogram=log.participation_histogram(), violations=violations)
  restarts = zcdp.check_restart_rounds(restart_rounds, num_rounds)
  if sampling_prob is None and sampling_groups is not None:
    raise ValueError('`sampling_groups` needs `sampling_prob`.')
  file_record = None
  if strategy_file is not None:
    file_record = _strategy_file_record(strategy_file, strategy, declared_rounds or num_rounds,
                                        participation)
    if file_record['mismatches']:
      message = (f'the strategy file {strategy_file} was optimized for another setting ('
                 f"{'; '.join(file_record['mismatches'])})")
      if not allow_strategy_setting_mismatch:
        raise StrategySettingMismatchError(
            f'{message}; regenerate it for this run or allow the mismatch.')
      warnings.append(message + '.')
  calibration_info = None
  if noise_multiplier is None:
    sens_sq = zcdp.accounted_sensitivity_squared(strategy, num_rounds, schema, restarts)
    if target_rho is not None:
      noise_multiplier = calibration.noise_multiplier_for_rho(target_rho, sens_sq)
      calibration_info = {'target_rho': float(target_rho)}
    else:
      noise_multiplier = calibration.noise_multiplier_for_epsilon(target_epsilon, sens_sq, delta)
      calibration_info = {'target_epsilon': float(target_epsilon)}
  headline = zcdp.guarantee(strategy, num_rounds, schema, noise_multiplier, delta,
                            restart_rounds=restarts)
  amplified = None
  if sampling_prob is not None:
    amplified = amplification.amplified_guarantee(
        strategy, num_rounds, headline.noise_multiplier,
        1 if sampling_groups is None else sampling_groups, sampling_prob, delta,
        restart_rounds=restarts)
  declared = None
  if log is not None and participation is not None:
    declared_n = _check_rounds(strategy, declared_rounds or num_rounds, restart_rounds)
    declared = zcdp.guarantee(strategy, declared_n, participation, noise_multiplier, delta,
                              restart_rounds=[r for r in restarts if r < declared_n])
  worst = None
  if observed is not None and observed_patterns:
    worst = _worst_observed_pattern(strategy, log, zcdp.segment_lengths(num_rounds, restarts))
  if worst is not None:
    sens_sq, client = worst
    rho = zcdp.rho_from_sensitivity(sens_sq, headline.noise_multiplier)
    observed = dataclasses.replace(observed, tree_patterns={
        'sensitivity_squared': sens_sq, 'rho': rho,
        'epsilon': zcdp.epsilon_from_rho(rho, delta), 'worst_client': log.client_id(client)})
  exact = strategy.segments_sensitivity_is_exact(zcdp.segment_lengths(num_rounds, restarts),
                                                 schema)
  if not exact:
    warnings.append('the squared sensitivity is an upper bound (the guarantee is conservative).')
  value_nm = None
  if clipped_count_stddev is not None:
    value_nm = plan_lib.inflated_noise_multiplier(headline.noise_multiplier,
                                                           clipped_count_stddev)
    if value_nm >= 2 * headline.noise_multiplier:
      warnings.append(f'adaptive clipping inflates the value noise multiplier by '
                      f'{value_nm / headline.noise_multiplier:.3g}x.')
  if secure_aggregation is not None:
    secure_aggregation = _check_secure_aggregation(secure_aggregation)
    if secure_aggregation['wrap_rounds']:
      warnings.append(f"the secure sum wrapped around its {secure_aggregation['bits']}-bit field "
                      f"in rounds {secure_aggregation['wrap_rounds']}: those rounds' sums are not "
                      'bounded by the clip, and the guarantee does not cover them.')
  return PrivacyReport(
      guarantee=headline, mechanism_config=_json_config(strategy.to_config()),
      participation_source=source,
      sensitivity_exact=exact, declared=declared, observed=observed,
      clipped_count_stddev=None if clipped_count_stddev is None else float(clipped_count_stddev),
      value_noise_multiplier=value_nm, calibration=calibration_info,
      secure_aggregation=secure_aggregation, warnings=tuple(warnings),
      equal_privacy=(equal_privacy_lib.equal_privacy(num_rounds, schema, rho=headline.rho,
                                                     run_strategy=strategy)
                     if equal_privacy else None),
      strategy_file=file_record, amplified=amplified)


def _strategy_file_record(path: str, strategy: base.Strategy, num_rounds: int,
                          participation: Optional[participation_lib.ParticipationSchema]) -> dict:
  """{'path', 'sha256', 'setting', 'mismatches'} of the strategy file `strategy` came from."""
  file_strategy, setting = files.load_strategy_and_setting(path)
  if file_strategy.name != strategy.name:
    raise ValueError(f'`strategy_file` {path!r} holds a {file_strategy.name} strategy, the report '
                     f'is for {strategy.name}.')
  return {'path': str(path), 'sha256': files.file_sha256(path), 'setting': setting,
          'mismatches': list(files.setting_mismatches(setting, num_rounds, participation))}


def _worst_observed_pattern(strategy: base.Strategy, log: log_lib.ParticipationLog,
                            segment_lengths: Sequence[int]):
  """(largest squared sensitivity, a client code with it) over the log's observed patterns, or
  None when the strategy has no per-pattern method. Reads the distinct patterns batch by batch
  (`ParticipationLog.iter_patterns`), so memory stays bounded by one batch."""
  worst = None
  for clients, pattern_index, rounds in log.iter_patterns():
    found = strategy.clients_sensitivity_squared(pattern_index, rounds, segment_lengths)
    if found is None:
      return None
    ids, sens = found
    i = int(np.argmax(sens))
    if worst is None or sens[i] > worst[0]:
      worst = (float(sens[i]), int(clients[ids[i]]))
  return worst


def _check_secure_aggregation(secure_aggregation: dict) -> dict:
  """Validates `build_report`'s `secure_aggregation` dict; returns a JSON-ready copy."""
  if not isinstance(secure_aggregation, dict):
    raise ValueError(f'`secure_aggregation` must be a dict, got {secure_aggregation!r}.')
  missing = {'bits', 'rotation', 'beta', 'modclip_prob', 'segments', 'wrap_rounds'} - set(
      secure_aggregation)
  if missing:
    raise ValueError(f'`secure_aggregation` lacks the keys {sorted(missing)}.')
  segments = []
  for segment in secure_aggregation['segments']:
    clip = _validation.check_positive_float(segment['clip'], 'clip')
    bound = _validation.check_positive_float(segment['sensitivity_clip'], 'sensitivity_clip')
    if bound < clip:
      raise ValueError(f'`sensitivity_clip`={bound} is below the clip {clip}: a post-rounding '
                       'bound is never smaller than the clip.')
    segments.append({'segment': int(segment['segment']), 'clip': clip, 'sensitivity_clip': bound})
  out = dict(secure_aggregation)
  out['segments'] = segments
  out['wrap_rounds'] = sorted(int(r) for r in secure_aggregation['wrap_rounds'])
  return out
