r"""Accounting benchmarks: a privacy report from a large synthetic participation log, tree accounting.

  python -m experiments.benchmarks.accounting_bench [--num_clients=1000000 --rounds=2000 \
      --clients_per_round=6500]

Measures (wall time, one process):
  1. writing a synthetic `client_id,round` log (not timed against the target): every round takes the
     next `clients_per_round` clients of one random permutation of the population, cycling through
     it, so every client comes back every num_clients / clients_per_round rounds (realized min_sep
     153 for the defaults, the Gboard paper's population / report-goal ceiling);
  2. reading the log (`participation_log.read_participation_log`);
  3. the full report from that log for a BLT (`report.build_report` + `report_render.write_report`
     with plots), target < 30 s;
  4. the same for the efficient tree without and with the observed-pattern accounting
     (`tree.clients_sensitivity_squared` over the log's distinct patterns);
  5. the exact tree accounting for n=2000, k=6, min_sep=314 (TF-Privacy's 250 s case), target < 1 s.
Results go to docs/benchmarks/accounting.md by hand (figures depend on machine load).
"""

import os
import tempfile

from absl import flags

from dp_ftrl_tff import plan
from dp_ftrl_tff.accounting import participation_log, report, report_render, zcdp
from dp_ftrl_tff.mechanisms import blt, participation, tree
from experiments.benchmarks import harness, synthetic_log

FLAGS = flags.FlagValues()
_NUM_CLIENTS = flags.DEFINE_integer('num_clients', 10**6, 'Population size.', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 2000, 'Rounds in the log.', flag_values=FLAGS)
_CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 6500, 'Clients per round.', flag_values=FLAGS)
_TREE_PATTERNS = flags.DEFINE_bool('tree_patterns', True,
                                   'Also time the observed-pattern tree accounting.', flag_values=FLAGS)
_WORK_DIR = flags.DEFINE_string('work_dir', None, 'Where to write the log (default: a temp dir).', flag_values=FLAGS)


def _timed(label, fn):
  """(value, wall seconds) of `fn()`, the seconds printed after `label`."""
  timing = harness.timed(fn)
  print(f'{label}: {timing.wall:.2f} s')
  return timing.value, timing.wall


def main(argv):
  del argv
  work_dir = _WORK_DIR.value or tempfile.mkdtemp(prefix='accounting_bench_')
  os.makedirs(work_dir, exist_ok=True)
  path = os.path.join(work_dir, 'participation_log.csv')
  rows, _ = _timed('write synthetic log', lambda: synthetic_log.write_synthetic_log(
      path, _NUM_CLIENTS.value, _ROUNDS.value, _CLIENTS_PER_ROUND.value))
  print(f'  {rows} rows, {os.path.getsize(path) / 1e6:.0f} MB')
  log, read_s = _timed('read log', lambda: participation_log.read_participation_log(path))
  print(f'  {log.num_clients} clients, realized min_sep {log.min_sep}, max participations '
        f'{log.max_participations}')
  declared = participation.ParticipationSchema(min_sep=100)

  def full_report(strategy, **kwargs):
    run_plan = plan.RunPlan.for_accounting(strategy, 7.379, num_rounds=_ROUNDS.value,
                                           participation=declared)
    result = report.build_report(run_plan, log, **kwargs)
    report_render.write_report(result, os.path.join(work_dir, strategy.name), plots=True)
    return result

  result, blt_s = _timed('blt report (build + json/md + plots)',
                         lambda: full_report(blt.PRODUCTION_STRATEGIES[400]))
  print(f'  rho {result.guarantee.rho:.4g}, epsilon {result.guarantee.epsilon:.4g}')
  print(f'read + blt report: {read_s + blt_s:.2f} s (target < 30 s)')
  _timed('tree_efficient report without observed patterns',
         lambda: full_report(tree.TreeStrategy('efficient'), observed_patterns=False))
  if _TREE_PATTERNS.value:
    result, _ = _timed('tree_efficient report with observed patterns',
                       lambda: full_report(tree.TreeStrategy('efficient')))
    print(f'  observed-pattern sens^2 {result.observed.tree_patterns["sensitivity_squared"]:.0f} '
          f'vs realized-schema sens^2 {result.guarantee.sensitivity_squared:.0f}')
  schema = participation.ParticipationSchema(min_sep=314, max_participations=6)
  best = harness.best_of(
      lambda: tree.TreeStrategy('vanilla').sensitivity_squared(2000, schema), 3)
  print(f'tree sensitivity n=2000 k=6 min_sep=314: best of 3 {best.wall:.3f} s')
  best = harness.best_of(lambda: zcdp.guarantee(tree.TreeStrategy('vanilla'), 2000, schema, 7.0), 3)
  print(f'tree guarantee (sensitivity + PLD epsilon): best of 3 {best.wall:.3f} s (target < 1 s)')


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
