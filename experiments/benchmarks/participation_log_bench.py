r"""Privacy report from a huge participation log: time and peak memory against the file size.

  .venv/bin/python -m experiments.benchmarks.participation_log_bench [--num_clients=1000000 \
      --rounds=2000 --clients_per_round=25000 --old_reader_rev=337204f --repeats=2]

Writes a synthetic `client_id,round` log into a temp dir (the cyclic cohorts of `accounting_bench`:
every client returns every num_clients / clients_per_round rounds; 50 million rows, 670 MB for the
defaults), deletes it at the end, and runs each case in its own Python subprocess, which prints its
timings and its peak resident memory (`getrusage(RUSAGE_SELF).ru_maxrss`, interpreter and imports
included):
  * `report`: `read_participation_log` (streaming) + `build_report` for the App. A BLT (b=400) +
    report.json / report.md (target: < 30 s, peak memory < 2x the file);
  * `tree`: the same for the efficient tree with the observed-pattern accounting;
  * `old_read`: the reader this one replaced (whole-file numpy arrays), loaded from git revision
    `--old_reader_rev` (skipped when empty or when git cannot show it), reading the same file.
Prints each case's seconds, peak memory and peak memory / file size, and the ratios new / old.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl import flags

from experiments.benchmarks import harness, synthetic_log
from experiments.cli import flag_parsing

FLAGS = flags.FlagValues()
_NUM_CLIENTS = flags.DEFINE_integer('num_clients', 10**6, 'Population size.', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 2000, 'Rounds in the log.', flag_values=FLAGS)
_CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 25000, 'Clients per round.',
                                          flag_values=FLAGS)
_OLD_READER_REV = flags.DEFINE_string(
    'old_reader_rev', '337204f', 'Git revision holding the whole-file reader to compare with '
    '(empty: skip it; it needs about 9x the file in memory).', flag_values=FLAGS)
_CASES = flags.DEFINE_list('cases', ['report', 'tree', 'old_read'], 'Cases to run.',
                           flag_values=FLAGS)
_REPEATS = harness.define_repeats(FLAGS, 1, 'Runs of each case (each line is printed).')
_WORK_DIR = flags.DEFINE_string('work_dir', None, 'Where to write the log (default: a temp dir, '
                                'deleted at the end).', flag_values=FLAGS)

_OLD_MODULE = 'dp_ftrl_tff/accounting/participation_log.py'

# Runs in a fresh interpreter: argv = case, log path, output dir, old reader module path.
_CHILD = r'''
import importlib.util, json, resource, sys, time
case, path, out_dir, old_module = sys.argv[1:5]
if case == 'old_read':
  spec = importlib.util.spec_from_file_location('old_participation_log', old_module)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  start = time.perf_counter()  # imports excluded, as below
  log = module.read_participation_log(path)
  read_s = time.perf_counter() - start
else:
  from dp_ftrl_tff import plan
  from dp_ftrl_tff.accounting import participation_log, report, report_render
  from dp_ftrl_tff.mechanisms import blt, participation, tree
  start = time.perf_counter()
  log = participation_log.read_participation_log(path)
  read_s = time.perf_counter() - start
  strategy = blt.PRODUCTION_STRATEGIES[400] if case == 'report' else tree.TreeStrategy('efficient')
  run_plan = plan.RunPlan.for_accounting(  # rounds: the log's
      strategy, 7.379, participation=participation.ParticipationSchema(min_sep=20))
  result = report.build_report(run_plan, log)
  report_render.write_report(result, out_dir, plots=False)
print(json.dumps({'read_s': read_s, 'total_s': time.perf_counter() - start,
                  'rows': log.num_rows, 'clients': log.num_clients,
                  'min_sep': log.min_sep, 'max_participations': log.max_participations,
                  'peak_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


def _old_reader(rev: str, work_dir: str):
  """Path of the old reader module written from git revision `rev`, or None."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    source = subprocess.run(['git', '-C', repo, 'show', f'{rev}:{_OLD_MODULE}'], check=True,
                            capture_output=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    print(f'old reader: git cannot show {rev}:{_OLD_MODULE} ({e}); skipped')
    return None
  path = os.path.join(work_dir, 'old_participation_log.py')
  with open(path, 'wb') as f:
    f.write(source)
  return path


def _run_case(case: str, log_path: str, work_dir: str, old_module: str) -> dict:
  timing = harness.timed(lambda: subprocess.run(
      [sys.executable, '-c', _CHILD, case, log_path, os.path.join(work_dir, f'report_{case}'),
       old_module or ''], capture_output=True, text=True, cwd=os.getcwd(), check=False))
  done = timing.value
  if done.returncode:
    return {'error': (done.stderr.strip().splitlines() or ['?'])[-1]}
  result = json.loads(done.stdout.strip().splitlines()[-1])
  result['wall_s'] = timing.wall
  return result


def _check_flags() -> None:
  for flag in (_NUM_CLIENTS, _ROUNDS, _CLIENTS_PER_ROUND):
    if flag.value < 1:
      flag_parsing.exit_with_error(ValueError(f'--{flag.name} must be positive, got {flag.value}'),
                                   FLAGS)
  if _CLIENTS_PER_ROUND.value > _NUM_CLIENTS.value:
    flag_parsing.exit_with_error(ValueError('--clients_per_round must be at most --num_clients'),
                                 FLAGS)
  unknown = set(_CASES.value) - {'report', 'tree', 'old_read'}
  if unknown:
    flag_parsing.exit_with_error(ValueError(f'--cases: unknown {sorted(unknown)}'), FLAGS)


def main(argv) -> int:
  """Exit status 1 when a case failed (named on stderr), else 0."""
  del argv
  _check_flags()
  made_dir = _WORK_DIR.value is None
  work_dir = _WORK_DIR.value or tempfile.mkdtemp(prefix='participation_log_bench_')
  os.makedirs(work_dir, exist_ok=True)
  try:
    log_path = os.path.join(work_dir, 'participation.csv')
    written = harness.timed(lambda: synthetic_log.write_synthetic_log(
        log_path, _NUM_CLIENTS.value, _ROUNDS.value, _CLIENTS_PER_ROUND.value))
    file_bytes = os.path.getsize(log_path)
    print(f'log: {written.value} rows, {_NUM_CLIENTS.value} clients x {_ROUNDS.value} rounds, '
          f'{file_bytes / 1e6:.0f} MB (written in {written.wall:.1f} s)')
    old_module = None
    if 'old_read' in _CASES.value and _OLD_READER_REV.value:
      old_module = _old_reader(_OLD_READER_REV.value, work_dir)
    best, failed = {}, []
    print(f'{"case":10s} {"read s":>8s} {"total s":>8s} {"wall s":>8s} {"peak MB":>9s} '
          f'{"peak/file":>9s}  realized (min_sep, k)')
    for _ in range(_REPEATS.value):
      for case in _CASES.value:
        if case == 'old_read' and not old_module:
          continue
        result = _run_case(case, log_path, work_dir, old_module)
        if 'error' in result:
          print(f'{case:10s} failed: {result["error"]}')
          failed.append(case)
          continue
        ratio = result['peak_bytes'] / file_bytes
        print(f'{case:10s} {result["read_s"]:8.2f} {result["total_s"]:8.2f} '
              f'{result["wall_s"]:8.2f} {result["peak_bytes"] / 1e6:9.0f} {ratio:9.2f}  '
              f'({result["min_sep"]}, {result["max_participations"]})')
        previous = best.get(case)
        if previous is None or result['total_s'] < previous['total_s']:
          best[case] = result
    if 'report' in best and 'old_read' in best:
      new, old = best['report'], best['old_read']
      print(f'streaming / old reader: read time {harness.ratio(new["read_s"], old["read_s"]):.2f}, '
            f'peak memory {harness.ratio(new["peak_bytes"], old["peak_bytes"]):.2f} (the new peak '
            'includes the whole report)')
    if failed:
      print(f'participation_log_bench: failed cases: {sorted(set(failed))}', file=sys.stderr)
      return 1
    return 0
  finally:
    if made_dir:
      shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
