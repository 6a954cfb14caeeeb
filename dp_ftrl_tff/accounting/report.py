"""The privacy report of a training run: guarantee, JSON, markdown checklist and plots.

`build_report` turns (strategy, rounds, noise multiplier or a calibration target, declared and/or
observed participation, restarts, adaptive clipping) into a `PrivacyReport`:
  * the headline guarantee: rho-zCDP and (epsilon, delta) by PLD (see `zcdp`). With a participation
    log it is computed for the REALIZED participation (realized min_sep and max participations, as the
    Gboard paper's tables are), which holds whatever was declared; a log that breaks the declared
    schema is reported loudly in `warnings`;
  * for trees with a log, also the exact guarantee over the observed clients' actual patterns (the
    tree module's per-client sum of squared node counts);
  * the markdown follows the BLT paper's App. C checklist (after Ponomareva et al. 2023, Sec. 5.3):
    DP setting, data accesses covered, final output, unit of privacy, adjacency, accounting method,
    assumptions, formal statement.

Conventions: rounds 0-based; `min_sep` = b (r2 - r1 >= b) and `min_separation` = b - 1 (TF-Privacy,
Gboard tables); noise multipliers are relative to the clip norm; sensitivities use clip norm 1.
Plots use the exact Gaussian conversion (fast; within ~1e-7 of PLD) and matplotlib's Agg backend,
imported only when plotting.
"""

import dataclasses
import json
import os
from typing import List, Optional, Sequence

import dp_accounting
import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.accounting import adaptive_clipping, calibration, zcdp
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.mechanisms import banded as banded_lib
from dp_ftrl_tff.mechanisms import base
from dp_ftrl_tff.mechanisms import blt as blt_lib
from dp_ftrl_tff.mechanisms import gaussian as gaussian_lib
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import tree as tree_lib

#: Keys every `report.json` has (the CLI contract), in order.
REQUIRED_KEYS = ('mechanism', 'rounds', 'min_sep', 'min_separation', 'max_participations',
                 'sensitivity_squared', 'noise_multiplier', 'effective_noise_multiplier', 'rho',
                 'epsilon', 'delta')

PLOT_FILES = ('epsilon_over_rounds.png', 'epsilon_vs_min_sep.png')


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
  """A finished privacy report; see `to_dict` for the JSON layout.

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

  @property
  def min_sep(self) -> int:
    return self.guarantee.participation.min_sep

  @property
  def max_participations(self) -> int:
    """Effective k = min(k, ceil(n / b))."""
    g = self.guarantee
    return g.participation.effective_max_participations(g.num_rounds)

  def to_dict(self) -> dict:
    """JSON-ready dict: `REQUIRED_KEYS` first, then details."""
    g = self.guarantee
    out = {
        'mechanism': g.mechanism,
        'rounds': g.num_rounds,
        'min_sep': self.min_sep,
        'min_separation': self.min_sep - 1,
        'max_participations': self.max_participations,
        'sensitivity_squared': g.sensitivity_squared,
        'noise_multiplier': g.noise_multiplier,
        'effective_noise_multiplier': g.effective_noise_multiplier,
        'rho': g.rho,
        'epsilon': g.epsilon,
        'delta': g.delta,
        'conversion': g.conversion,
        'fixed_epoch': g.participation.fixed_epoch,
        'participation_source': self.participation_source,
        'sensitivity_exact': self.sensitivity_exact,
        'restart_rounds': list(g.restart_rounds),
        'mechanism_config': self.mechanism_config,
        'clipped_count_stddev': self.clipped_count_stddev,
        'value_noise_multiplier': self.value_noise_multiplier,
        'calibration': self.calibration,
        'secure_aggregation': self.secure_aggregation,
        'declared': None if self.declared is None else _guarantee_dict(self.declared),
        'observed': None if self.observed is None else dataclasses.asdict(self.observed),
        'warnings': list(self.warnings),
        'dp_accounting_version': getattr(dp_accounting, '__version__', '0.4.3'),
    }
    if out['observed'] is not None:
      out['observed']['histogram'] = {str(k): v for k, v in self.observed.histogram.items()}
      out['observed']['violations'] = list(self.observed.violations)
    return out

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, allow_nan=True)

  def summary(self) -> str:
    """A few lines for a terminal."""
    g = self.guarantee
    lines = [f'{g.mechanism}: n={g.num_rounds}, min_sep={self.min_sep} (min_separation='
             f'{self.min_sep - 1}), max_participations={self.max_participations} '
             f'[{self.participation_source}], noise_multiplier={g.noise_multiplier:.6g}',
             f'  sens^2={g.sensitivity_squared:.6g}{"" if self.sensitivity_exact else " (upper bound)"}'
             f', effective noise multiplier={g.effective_noise_multiplier:.6g}',
             f'  rho-zCDP={g.rho:.6g}, (epsilon, delta)=({g.epsilon:.6g}, {g.delta:g}) by '
             f'{g.conversion.upper()}']
    if self.value_noise_multiplier is not None:
      lines.append(f'  adaptive clipping: model-sum noise multiplier z_Delta='
                   f'{self.value_noise_multiplier:.10g} (clipped-count std '
                   f'{self.clipped_count_stddev:g})')
    if self.secure_aggregation is not None:
      wraps = self.secure_aggregation['wrap_rounds']
      lines.append(f"  SecAgg: {self.secure_aggregation['bits']} bits, noise on the post-rounding "
                   f'clip, {len(wraps)} round(s) with a modular wrap')
    if self.observed is not None and self.observed.tree_patterns is not None:
      t = self.observed.tree_patterns
      lines.append(f'  observed patterns: sens^2={t["sensitivity_squared"]:.6g}, rho={t["rho"]:.6g}'
                   f', epsilon={t["epsilon"]:.6g}')
    lines.extend(f'  WARNING: {w}' for w in self.warnings)
    return '\n'.join(lines)

  def to_markdown(self) -> str:
    """The BLT paper's App. C checklist, filled in."""
    g = self.guarantee
    exact = 'exact' if self.sensitivity_exact else 'an upper bound'
    restarts = (', '.join(str(r) for r in g.restart_rounds) if g.restart_rounds else 'none')
    md = [f'# Privacy report: {g.mechanism}, {g.num_rounds} rounds', '']
    if self.warnings:
      md += ['> **WARNING**', '>'] + [f'> - {w}' for w in self.warnings] + ['']
    md += [
        '**Formal statement.** The training run satisfies '
        f'**rho-zCDP with rho = {g.rho:.6g}** and **(epsilon, delta)-DP with epsilon = '
        f'{g.epsilon:.6g}, delta = {g.delta:g}**, at the device (client) level, under the '
        'participation stated below.', '',
        '## 1. DP setting',
        '- Central DP: the server is trusted to clip, aggregate and add the correlated noise as '
        'specified.', '',
        '## 2. Instantiating the DP definition',
        '- **Data accesses covered:** every well-behaved client (one that follows the protocol, '
        'including the participation limits) in this single training run. Hyperparameter tuning '
        'and checkpoint selection are not covered.',
        '- **Final mechanism output:** the full sequence of noisy aggregates, hence every '
        'intermediate model (not only the final checkpoint).',
        '- **Unit of privacy:** one device/client (user-level for single-device users); a client '
        'may hold arbitrarily much data.',
        '- **Adjacency:** zero-out: the neighbouring run replaces all updates of one client by zero '
        '(a form of add/remove).', '',
        '## 3. Mechanism',
        f'- Mechanism: `{g.mechanism}`, configuration `{json.dumps(self.mechanism_config)}`.',
        f'- Rounds n = {g.num_rounds} (0-based rounds 0..{g.num_rounds - 1}); noise restarts at '
        f'rounds: {restarts}.',
        f'- Noise multiplier sigma = {g.noise_multiplier:.6g} (noise std sigma x clip norm on the '
        f'sum of clipped updates, before correlation); effective noise multiplier sigma / sens = '
        f'{g.effective_noise_multiplier:.6g}.']
    if self.value_noise_multiplier is not None:
      md.append(f'- Adaptive clipping (Gboard Thm. 1): clipped-count noise std '
                f'{self.clipped_count_stddev:g}; the model sum uses z_Delta = '
                f'{self.value_noise_multiplier:.10g}, equivalent to the accounted sigma above.')
    if self.secure_aggregation is not None:
      sa = self.secure_aggregation
      ratio = max((seg['sensitivity_clip'] / seg['clip'] for seg in sa['segments']), default=1.0)
      md.append(f"- SecAgg ({sa['bits']} bits, rotation {sa['rotation']}, beta {sa['beta']:g}): "
                'records are rounded before the secure sum, which can grow their norm; each '
                'segment\'s noise std is sigma x its post-rounding clip (at most '
                f'{ratio:.6g} x the clip), so sigma is relative to the post-rounding bound. Rounds '
                f"whose secure sum wrapped around the field: {sa['wrap_rounds'] or 'none'}.")
    if self.calibration is not None:
      (key, value), = self.calibration.items()
      md.append(f'- sigma was calibrated to meet {key} = {value:g}.')
    md += ['', '## 4. Participation',
           f'- Source: **{self.participation_source}**'
           + (' (realized in the participation log; Gboard-paper practice)'
              if self.participation_source == 'observed' else ' (enforced by the client sampler)'),
           f'- min_sep b = {self.min_sep}: two participations r1 < r2 of one client satisfy '
           f'r2 - r1 >= b; min_separation (rounds strictly between, TF-Privacy / Gboard MinS) = '
           f'{self.min_sep - 1}.',
           f'- max_participations k = {self.max_participations} (effective: min(k, ceil(n / b)))'
           + ('; fixed-epoch schema.' if g.participation.fixed_epoch else '.')]
    if self.observed is not None:
      o = self.observed
      md += [f'- Log `{o.path}`: {o.num_rows} rows, {o.num_clients} clients, rounds 0..'
             f'{o.num_rounds - 1}; realized min_sep = {o.min_sep}, realized max participations = '
             f'{o.max_participations}.',
             f'- Participations per client: {o.histogram}.']
      if o.violations:
        md += ['- **The log VIOLATES the declared schema:**'] + [f'  - {v}' for v in o.violations]
        md.append('  The guarantee above is the one that holds for the realized participation.')
      if o.tree_patterns is not None:
        t = o.tree_patterns
        md.append(f'- Exact over the observed clients\' actual patterns (tree): sens^2 = '
                  f'{t["sensitivity_squared"]:.6g}, rho = {t["rho"]:.6g}, epsilon = '
                  f'{t["epsilon"]:.6g} (worst client `{t["worst_client"]}`).')
    if self.declared is not None:
      d = self.declared
      md.append(f'- Under the declared schema ({d.participation}): sens^2 = '
                f'{d.sensitivity_squared:.6g}, rho = {d.rho:.6g}, epsilon = {d.epsilon:.6g}'
                + (' (does NOT hold: the log violates it).'
                   if self.observed is not None and self.observed.violations else '.'))
    md += ['', '## 5. Accounting',
           f'- Squared sensitivity (clip norm 1) sens^2 = {g.sensitivity_squared:.10g}, {exact}: max '
           'over admissible patterns of ||C u||^2, composed across restart segments.',
           f'- rho-zCDP = sens^2 / (2 sigma^2) = {g.rho:.10g}.',
           f'- (epsilon, delta): {_CONVERSION_TEXT[g.conversion]} (dp_accounting '
           f'{getattr(dp_accounting, "__version__", "0.4.3")}) on one Gaussian mechanism with noise '
           f'multiplier 1 / sqrt(2 rho): epsilon = {g.epsilon:.10g} at delta = {g.delta:g}.',
           '- No amplification by sampling is assumed.',
           '- Transparency: computed with `python -m experiments.privacy_report` (dp_ftrl_tff).', '']
    return '\n'.join(md)


_CONVERSION_TEXT = {
    'pld': 'PLD accounting (add-or-remove, value discretization 1e-4)',
    'gaussian': 'the exact Gaussian tradeoff curve',
    'rdp': 'RDP with the Canonne-Kamath-Steinke conversion on TF-Privacy\'s orders',
}


def _guarantee_dict(g: zcdp.Guarantee) -> dict:
  return {'rounds': g.num_rounds, 'min_sep': g.participation.min_sep,
          'min_separation': g.participation.min_sep - 1,
          'max_participations': g.participation.effective_max_participations(g.num_rounds),
          'fixed_epoch': g.participation.fixed_epoch, 'sensitivity_squared': g.sensitivity_squared,
          'rho': g.rho, 'epsilon': g.epsilon, 'delta': g.delta}


def _json_config(config: dict) -> dict:
  """The strategy config with arrays (e.g. banded `band_rows`) summarized by their shape."""
  return {k: (f'<float64 array of shape {list(np.shape(v))}>' if isinstance(v, np.ndarray) else v)
          for k, v in config.items()}


def _sensitivity_exact(strategy: base.Strategy, num_rounds: int,
                       participation: participation_lib.ParticipationSchema,
                       restarts: Sequence[int]) -> bool:
  if isinstance(strategy, (tree_lib.TreeStrategy, gaussian_lib.GaussianStrategy)):
    return True
  if restarts:
    return False
  if isinstance(strategy, blt_lib.BLTStrategy):
    return bool(strategy.sensitivity_is_exact(num_rounds, participation))
  if isinstance(strategy, banded_lib.BandedStrategy):
    single = participation.is_single_participation(num_rounds)
    return single or strategy.num_bands <= participation.min_sep
  return False


def build_report(strategy: base.Strategy, num_rounds: Optional[int] = None,
                 participation: Optional[participation_lib.ParticipationSchema] = None, *,
                 noise_multiplier: Optional[float] = None, target_epsilon: Optional[float] = None,
                 target_rho: Optional[float] = None, delta: float = zcdp.DEFAULT_DELTA,
                 restart_rounds: Optional[Sequence[int]] = None,
                 log: Optional[log_lib.ParticipationLog] = None,
                 clipped_count_stddev: Optional[float] = None,
                 observed_patterns: bool = True,
                 secure_aggregation: Optional[dict] = None) -> PrivacyReport:
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
    num_rounds = strategy.check_num_rounds(num_rounds)
    schema, source, observed = participation, 'declared', None
  else:
    num_rounds = log.num_rounds if num_rounds is None else _validation.check_positive_int(
        num_rounds, 'num_rounds')
    violations = tuple(log.violations(participation, num_rounds) if participation is not None
                       else (log.violations(participation_lib.ParticipationSchema(), num_rounds)))
    num_rounds = strategy.check_num_rounds(max(num_rounds, log.num_rounds))
    schema, source = log.realized_schema(num_rounds), 'observed'
    warnings.extend(f'participation log violates the declared schema: {v}' for v in violations)
    observed = ObservedParticipation(
        path=log.path, num_rows=log.num_rows, num_clients=log.num_clients,
        num_rounds=log.num_rounds, min_sep=log.min_sep, max_participations=log.max_participations,
        histogram=log.participation_histogram(), violations=violations)
  restarts = zcdp.check_restart_rounds(restart_rounds, num_rounds)
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
  declared = None
  if log is not None and participation is not None:
    declared_n = strategy.check_num_rounds(declared_rounds or num_rounds)
    declared = zcdp.guarantee(strategy, declared_n, participation, noise_multiplier, delta,
                              restart_rounds=[r for r in restarts if r < declared_n])
  if observed is not None and observed_patterns and isinstance(strategy, tree_lib.TreeStrategy):
    ids, sens = tree_lib.clients_sensitivity_squared(
        log.client_index, log.rounds, zcdp.segment_lengths(num_rounds, restarts),
        strategy.completion)
    worst = int(np.argmax(sens))
    rho = zcdp.rho_from_sensitivity(float(sens[worst]), headline.noise_multiplier)
    observed = dataclasses.replace(observed, tree_patterns={
        'sensitivity_squared': float(sens[worst]), 'rho': rho,
        'epsilon': zcdp.epsilon_from_rho(rho, delta), 'worst_client': log.client_id(ids[worst])})
  exact = _sensitivity_exact(strategy, num_rounds, schema, restarts)
  if not exact:
    warnings.append('the squared sensitivity is an upper bound (the guarantee is conservative).')
  value_nm = None
  if clipped_count_stddev is not None:
    value_nm = adaptive_clipping.inflated_noise_multiplier(headline.noise_multiplier,
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
      secure_aggregation=secure_aggregation, warnings=tuple(warnings))


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


def alternative_strategies(strategy: base.Strategy) -> dict:
  """{label: strategy}: this one plus DP-SGD, the efficient tree and the BLT paper's default BLT."""
  out = {f'{strategy.name} (this report)': strategy}
  for other in (gaussian_lib.GaussianStrategy(), tree_lib.TreeStrategy('efficient'),
                blt_lib.PRODUCTION_STRATEGIES[400]):
    if other.name != strategy.name:
      label = 'blt (App. A, b=400)' if other.name == 'blt' else other.name
      out[label] = other
  return out


def _epsilon_curve(strategy, schema_for, xs, sigma, delta, restarts, rounds_for):
  values = []
  for x in xs:
    n = rounds_for(x)
    g = zcdp.guarantee(strategy, n, schema_for(x), sigma, delta,
                       restart_rounds=[r for r in restarts if r < n], conversion='gaussian')
    values.append(g.epsilon)
  return values


def write_plots(report: PrivacyReport, strategy: base.Strategy, output_dir: str,
                num_points: int = 24) -> List[str]:
  """Writes `PLOT_FILES` into `output_dir`: epsilon over rounds, and epsilon versus min_sep for this
  mechanism and the alternatives at the same noise multiplier (exact Gaussian conversion)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  g = report.guarantee
  n, sigma, delta, restarts = g.num_rounds, g.noise_multiplier, g.delta, g.restart_rounds
  schema = g.participation
  os.makedirs(output_dir, exist_ok=True)
  paths = []

  rounds = np.unique(np.linspace(1, n, num_points).round().astype(int))
  eps = _epsilon_curve(strategy, lambda t: schema, rounds, sigma, delta, restarts, lambda t: int(t))
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(rounds, eps, marker='o', ms=3)
  ax.set_xlabel('rounds trained')
  ax.set_ylabel(f'epsilon (delta={delta:g})')
  ax.set_title(f'{g.mechanism}, sigma={sigma:.4g}, min_sep={schema.min_sep}, '
               f'k={schema.effective_max_participations(n)}')
  ax.grid(alpha=0.3)
  fig.tight_layout()
  paths.append(os.path.join(output_dir, PLOT_FILES[0]))
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)

  k = schema.max_participations
  low = max(1, n // 64)
  seps = np.unique(np.geomspace(low, n, num_points).round().astype(int))
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, other in alternative_strategies(strategy).items():
    if other.max_rounds is not None and other.max_rounds < n:
      continue
    eps = _epsilon_curve(
        other, lambda b: participation_lib.ParticipationSchema(int(b), k), seps, sigma, delta,
        restarts, lambda b: n)
    ax.plot(seps, eps, marker='o', ms=3, label=label)
  ax.axvline(schema.min_sep, color='gray', ls='--', lw=1, label=f'min_sep={schema.min_sep}')
  ax.set_xscale('log')
  ax.set_yscale('log')
  ax.set_xlabel('min_sep b (rounds)')
  ax.set_ylabel(f'epsilon (delta={delta:g})')
  ax.set_title(f'n={n}, sigma={sigma:.4g}, max_participations={k or "ceil(n/b)"}')
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize=8)
  fig.text(0.01, 0.01, 'Same noise multiplier for all; their errors differ (DP-SGD adds the most).',
           fontsize=7, color='gray')
  fig.tight_layout()
  paths.append(os.path.join(output_dir, PLOT_FILES[1]))
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)
  return paths


def write_report(report: PrivacyReport, strategy: base.Strategy, output_dir: str,
                 plots: bool = True) -> List[str]:
  """Writes report.json, report.md and (optionally) the plots; returns the paths written."""
  if not isinstance(output_dir, str) or not output_dir:
    raise ValueError(f'`output_dir` must be a non-empty path, got {output_dir!r}.')
  os.makedirs(output_dir, exist_ok=True)
  paths = [os.path.join(output_dir, 'report.json'), os.path.join(output_dir, 'report.md')]
  with open(paths[0], 'w') as f:
    f.write(report.to_json() + '\n')
  with open(paths[1], 'w') as f:
    f.write(report.to_markdown())
  if plots:
    paths.extend(write_plots(report, strategy, output_dir))
  return paths

