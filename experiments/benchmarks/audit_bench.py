r"""Issue 46's acceptance benchmark: one BLT run of the EMNIST driver with 10,000 canaries, audited.

  tools/in_session.sh .venv/bin/python -m experiments.benchmarks.audit_bench \
      [--canary_clients=10000] [--synthetic_num_clients=500] [--clients_per_round=2100] \
      [--min_sep=5] [--max_participations=4] [--rounds=20] [--target_epsilon=8] \
      [--target_delta=1e-6] [--only_digits] [--work_dir=DIR] [--run_dir=RUN]

1. Trains (a fresh `experiments.emnist.run_emnist` subprocess; skipped with `--run_dir`, an existing
   finished run of the same design): tiny model (62 classes: d = 48,670), synthetic clients plus
   the canaries, BLT calibrated to `--target_epsilon` at `--target_delta`, min-sep sampling with
   `--clients_per_round` chosen so that every client (canary) takes part `--max_participations`
   times, `--min_sep` rounds apart (population / clients_per_round = min_sep, rounds = min_sep *
   max_participations). Its wall time and peak resident memory (`os.wait4` of the child) are
   printed.
2. Reruns the report step alone on the finished run (`experiments.privacy_report --plan
   --participation_log --canaries`, a fresh subprocess, its defaults: plots and the equal-privacy
   table included) and prints its wall time and peak memory; then, in this process, the time of each
   part: writing canary files of this size (`CanaryFilesWriter`, every round then the final cosines,
   into a temp dir), reading them back, the canaries' rounds from the log, the scores of the three
   threat models, and every bound.
3. Prints the report's certified bounds (95% together, Bonferroni over its 3 rows x 4 methods) per
   threat model and method, the best one as a fraction of the accounted epsilon (goal: >= 0.5), and,
   on the SAME whitened per-round scores, what a single-score audit certifies: each canary's one
   whitened round with the largest signal (chosen from its pattern alone, so nothing is paid),
   through the same four methods at the same per-bound confidence. The ceiling: the canaries' own
   Gaussian-DP mu (||L^-1 u|| / sigma, from their patterns) and its epsilon, against the accounted
   mu (sens / sigma), and what the four methods certify on Gaussian scores of those mu without
   interference (simulated, seed 0): the other clients' updates projected on a canary's direction
   are noise the accountant does not count, up to (population / d) ||L^-1 u||^2 in variance,
   coherent over the canary's rounds (min-sep cohorts recur together), so d matters
   (`--only_digits`). With `--remove_canary_interference` (default) also the per-round whitened
   scores with the canaries' known mutual interference subtracted (a diagnostic, not in the report).

Units: seconds (wall, `time.perf_counter`), MB (peak RSS, 2^20 bytes). A benchmark, not a test: the
training takes about 15 minutes on the 2 shared cores (62 classes).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import report_files
from dp_ftrl_tff.auditing import empirical, gdp, per_round
from experiments.benchmarks import harness

FLAGS = flags.FlagValues()
_CANARIES = flags.DEFINE_integer('canary_clients', 10000, 'Canary clients (as many unseen).',
                                 flag_values=FLAGS, lower_bound=1)
_CLIENTS = flags.DEFINE_integer('synthetic_num_clients', 500, 'Synthetic (training) clients.',
                                flag_values=FLAGS, lower_bound=1)
_DIGITS = flags.DEFINE_bool('only_digits', False, 'The tiny model on 10 classes (d = 7850) instead '
                             'of 62 (d = 48,670): 6.2x more canary interference.',
                             flag_values=FLAGS)
_EXAMPLES = flags.DEFINE_integer('synthetic_examples_per_client', 4,
                                 'Mean examples per synthetic client.', flag_values=FLAGS,
                                 lower_bound=1)
_PER_ROUND = flags.DEFINE_integer('clients_per_round', 2100,
                                  'Clients per round (canaries included).', flag_values=FLAGS,
                                  lower_bound=1)
_MIN_SEP = flags.DEFINE_integer('min_sep', 5, 'min_sep b of the sampler and the accounting.',
                                flag_values=FLAGS, lower_bound=1)
_K = flags.DEFINE_integer('max_participations', 4, 'k: participations per client.',
                          flag_values=FLAGS, lower_bound=1)
_ROUNDS = flags.DEFINE_integer('rounds', 20, 'Training rounds.', flag_values=FLAGS, lower_bound=1)
_EPSILON = flags.DEFINE_float('target_epsilon', 8.0, 'Accounted epsilon (calibrated).',
                              flag_values=FLAGS)
_DELTA = flags.DEFINE_float('target_delta', 1e-6, 'delta of the accounting and the bounds.',
                            flag_values=FLAGS)
_NOISE_SEED = flags.DEFINE_integer('noise_seed', 1, 'Noise seed of the run (reproducible).',
                                   flag_values=FLAGS)
_WORK_DIR = flags.DEFINE_string('work_dir', None, 'Where the run goes (kept); default a temp dir '
                                '(deleted).', flag_values=FLAGS)
_REMOVE = flags.DEFINE_bool('remove_canary_interference', True, 'Also score the per-round '
                             'whitened statistic with the canaries\' known mutual interference '
                             'removed (regenerates the 2N directions with TensorFlow: about 70 s '
                             'at d = 48,670). Not in the report: a diagnostic.', flag_values=FLAGS)
_RUN_DIR = flags.DEFINE_string('run_dir', None, 'A finished run to audit instead of training one.',
                               flag_values=FLAGS)

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MB = 2.0 ** 20


def _child(args, log_path: str):
  """Runs `args` (stdout and stderr to `log_path`); (wall seconds, peak RSS MB) of the child."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  start = time.perf_counter()
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(args, cwd=_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - start
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode != 0:
    with open(log_path) as f:
      raise RuntimeError(f'{" ".join(args)} exited {proc.returncode}: {f.read()[-2000:]}')
  return wall, usage.ru_maxrss / 1024.0  # ru_maxrss is in KB on Linux


def _train(root: str) -> str:
  name = 'audit'
  args = [sys.executable, '-m', 'experiments.emnist.run_emnist', '--model=tiny',
          '--only_digits' if _DIGITS.value else '--noonly_digits',
          '--data=synthetic', f'--synthetic_num_clients={_CLIENTS.value}',
          f'--synthetic_examples_per_client={_EXAMPLES.value}',
          f'--canary_clients={_CANARIES.value}', f'--clients_per_round={_PER_ROUND.value}',
          f'--min_sep={_MIN_SEP.value}', f'--max_participations={_K.value}',
          f'--rounds={_ROUNDS.value}', '--mechanism=blt', f'--target_epsilon={_EPSILON.value}',
          f'--target_delta={_DELTA.value}', '--eval_every=1000', '--checkpoint_every=1000',
          '--seed=0', f'--noise_seed={_NOISE_SEED.value}', f'--root_output_dir={root}',
          f'--experiment_name={name}']
  print('training:', ' '.join(args[1:]), flush=True)
  wall, peak = _child(args, os.path.join(root, 'train.log'))
  print(f'training: {wall:.1f} s wall, peak {peak:.0f} MB', flush=True)
  return os.path.join(root, name)


def _time_canary_files(record: auditing.CanaryRecord, plan: plan_lib.RunPlan) -> float:
  """Seconds to write canary files of `record`'s size as the driver does (every round, then the
  final cosines), into a temp dir."""
  with tempfile.TemporaryDirectory() as directory:
    writer = auditing.CanaryFilesWriter(directory, record.num_seen, record.seed,
                                        list(record.client_ids), record.dimension, plan=plan)
    def write():
      writer.write_metadata()
      for t in range(record.num_rounds):
        writer.append_round(t, record.round_projections[:, t].tolist())
      writer.write_final(record.final_cosines.tolist())
    return harness.timed(write).wall


def _without_canary_interference(record: auditing.CanaryRecord, participation) -> np.ndarray:
  """The record's projections minus what the OTHER inserted canaries put on each direction.

  Round t's release holds S_t = sum of the canaries inserted in round t (c_j in units of the clip);
  the auditor knows every direction and the log, so it can subtract <c_i, S_t> from direction i's
  projection, keeping a seen canary's own contribution (<c_i, c_i> = 1 in its rounds). What is left
  is the canary's signal, the noise and the training clients' updates. Directions are regenerated
  as the run drew them (`canaries.direction`), 1000 at a time.
  """
  # TensorFlow only here: the module itself imports without it (its `--help` stays fast).
  import tensorflow as tf

  from dp_ftrl_tff.learning import canaries as canaries_lib
  seen, rounds, dimension = record.num_seen, record.num_rounds, record.dimension
  inserted = canaries_lib.Canaries(seen, seed=record.seed, norm=1.0)

  @tf.function
  def directions(start, size):
    return tf.map_fn(lambda i: canaries_lib.direction(inserted, i, dimension),
                     tf.range(start, start + size), fn_output_signature=tf.float32)

  chunk, sums = 1000, np.zeros((dimension, rounds))
  for start in range(0, seen, chunk):
    block = directions(tf.constant(start), tf.constant(min(chunk, seen - start))).numpy()
    sums += block.astype(np.float64).T @ participation[start:start + chunk]
  correction = np.zeros((2 * seen, rounds))
  for start in range(0, 2 * seen, chunk):
    block = directions(tf.constant(start), tf.constant(min(chunk, 2 * seen - start))).numpy()
    correction[start:start + chunk] = block.astype(np.float64) @ sums
  correction[:seen] -= participation
  return record.round_projections - correction


def _single_round(seen_rounds, unseen_rounds, signal):
  """Each canary's one whitened round with the largest |signal| (from its pattern alone), signed so
  that a seen canary scores high: (seen, unseen) single scores."""
  column = np.argmax(np.abs(signal), axis=1)
  rows = np.arange(signal.shape[0])
  sign = np.sign(signal[rows, column])
  return seen_rounds[rows, column] * sign, unseen_rounds[rows, column] * sign


def main(argv):
  del argv
  print(harness.conditions(), flush=True)
  with tempfile.TemporaryDirectory() as temp:
    root = _WORK_DIR.value or temp
    os.makedirs(root, exist_ok=True)
    train_text = 'not timed (--run_dir)'
    if _RUN_DIR.value:
      run = _RUN_DIR.value
    else:
      start = time.perf_counter()
      run = _train(root)
      train_text = f'{time.perf_counter() - start:.0f} s'
    paths = {name: os.path.join(run, name) for name in
             ('plan.json', 'participation.csv', 'canaries.json')}
    report_dir = os.path.join(root, 'report_bench')
    args = [sys.executable, '-m', 'experiments.privacy_report', f'--plan={paths["plan.json"]}',
            f'--participation_log={paths["participation.csv"]}',
            f'--canaries={paths["canaries.json"]}', f'--output_dir={report_dir}']
    report_wall, report_peak = _child(args, os.path.join(root, 'report.log'))
    print(f'report step (privacy_report, fresh process): {report_wall:.1f} s wall, peak '
          f'{report_peak:.0f} MB', flush=True)
    with open(os.path.join(report_dir, 'report.json')) as f:
      report = json.load(f)

    # The parts, in this process.
    plan = plan_lib.load_plan(paths['plan.json'])
    read = harness.timed(lambda: report_files.read_canary_record(paths['canaries.json']))
    record = read.value
    write_s = _time_canary_files(record, plan)
    log = report_files.read_log(paths['participation.csv'])
    parts = harness.timed(lambda: auditing.canary_participation(
        record, *log.rows_of(record.client_ids)))
    participation = parts.value
    noise = auditing.plan_noise_matrix(plan, record.num_rounds)
    scores = harness.timed(lambda: auditing.canary_statistics(
        record.round_projections, participation, record.final_cosines, noise))
    rows = harness.timed(lambda: auditing.empirical_privacy(
        plan, record, participation, _DELTA.value, min_seen=auditing.MIN_SEEN_CANARIES))
    print(f'canaries: {record.num_seen} seen + {record.num_seen} unseen directions, '
          f'{record.num_rounds} rounds, d = {record.dimension}; canaries.csv '
          f'{os.path.getsize(os.path.join(run, "canaries.csv")) / _MB:.1f} MB')
    print(f'parts (s): write canary files {write_s:.2f}, read {read.wall:.2f}, canaries\' rounds '
          f'from the log {parts.wall:.2f}, scores of 3 threat models {scores.wall:.2f}, '
          f'rows (scores + estimates + 12 bounds + attack figures) {rows.wall:.2f}')

    seen_rounds, unseen_rounds, signal = auditing.whitened_rounds(
        record.round_projections, participation, noise)
    took = participation.sum(axis=1)
    counts = {int(k): int(n) for k, n in zip(*np.unique(took, return_counts=True), strict=True)}
    sigma = report['noise_multiplier']
    mu_accounted = np.sqrt(report['sensitivity_squared']) / sigma
    mu_canaries = np.linalg.norm(signal, axis=1) / sigma
    accounted = report['epsilon']
    print(f'participations per seen canary: {counts}')
    weights = signal / np.linalg.norm(signal, axis=1, keepdims=True)
    unseen_std = float(np.std(np.sum(unseen_rounds * weights, axis=1)))
    print(f'unseen whitened combined scores: std {unseen_std:.3f} = {unseen_std / sigma:.3f} x '
          'sigma (1 without interference: the other clients\' updates projected on a direction '
          'add the rest)')
    print(f'accounted epsilon {accounted:.4g} at delta {report["delta"]:g} (noise multiplier '
          f'{sigma:.4g}, sens^2 {report["sensitivity_squared"]:.4g}): mu {mu_accounted:.4f}; '
          f'the canaries\' own mu ||L^-1 u|| / sigma: mean {mu_canaries.mean():.4f}, min '
          f'{mu_canaries.min():.4f}, max {mu_canaries.max():.4f} (mu-GDP epsilon of the mean '
          f'{gdp.epsilon_for_delta(float(mu_canaries.mean()), _DELTA.value):.4g})')

    each = empirical.bound_confidence(0.95, len(rows.value))
    print(f'\ncertified lower bounds at 95% together ({100 * each:.3f}% each), epsilon and '
          'fraction of the accounted epsilon')
    print(f'{"scores":<38} ' + ' '.join(f'{m:>17}' for m in auditing.METHODS))
    table = {}
    for row in rows.value:
      table[row.threat_model] = {b.method: b.epsilon for b in row.bounds}
    single = _single_round(seen_rounds, unseen_rounds, signal)
    single_bounds = harness.timed(lambda: {
        m: per_round.BOUNDS[m](*single, _DELTA.value, each).epsilon for m in auditing.METHODS})
    table['one whitened round (single score)'] = single_bounds.value
    if _REMOVE.value:
      cleaned = harness.timed(lambda: _without_canary_interference(record, participation))
      clean_seen, clean_unseen, _ = auditing.whitened_rounds(cleaned.value, participation, noise)
      clean = (per_round.combined_scores(clean_seen, signal),
               per_round.combined_scores(clean_unseen, signal))
      print(f'known canary interference removed ({cleaned.wall:.0f} s): unseen combined scores\' '
            f'std {np.std(clean[1]) / sigma:.3f} x sigma')
      table['whitened, canaries\' interference out'] = {
          m: per_round.BOUNDS[m](*clean, _DELTA.value, each).epsilon for m in auditing.METHODS}
    # The ceiling: the same canaries without interference, N(mu_i, 1) against N(0, 1) (seeded).
    rng = np.random.default_rng(0)
    ideal = (mu_canaries + rng.standard_normal(mu_canaries.size),
             rng.standard_normal(mu_canaries.size))
    table['ideal: N(mu_i, 1) vs N(0, 1)'] = {
        m: per_round.BOUNDS[m](*ideal, _DELTA.value, each).epsilon for m in auditing.METHODS}
    for name, bounds in table.items():
      print(f'{name:<38} ' + ' '.join(f'{bounds[m]:>8.3f} ({bounds[m] / accounted:.3f})'
                                      for m in auditing.METHODS))
    best = report['empirical_best_bound']
    met = 'met' if best['fraction_of_accounted'] >= 0.5 else 'not met'
    print(f'\nbest certified (report): {best["epsilon"]:.4g} by {best["method"]} '
          f'({best["threat_model"]}) = {best["fraction_of_accounted"]:.3f} of the accounted '
          f'{accounted:.4g}; goal >= 0.5: {met}')
    print('the rows\' estimates: ' + ', '.join(
        f'{row.threat_model} {row.epsilon:.4g}' for row in rows.value))
    with open(os.path.join(run, 'hparams.json')) as f:
      hp = json.load(f)
    what = (f'certified audit of one {hp["mechanism"]} run (issue 46): EMNIST driver, '
            f'{hp["task"]["model"]} model (d = {record.dimension}), '
            f'{hp["synthetic_num_clients"]} synthetic clients + '
            f'{hp["canary_clients"]} canaries, {hp["clients_per_round"]} per round, min_sep '
            f'{hp["min_sep"]}, k {hp["max_participations"]}, {hp["rounds"]} rounds, epsilon '
            f'{accounted:.3g} at delta {report["delta"]:g}')
    ours = (f'best {best["epsilon"]:.3f} ({best["method"]}, {best["threat_model"]}); report step '
            f'{report_wall:.0f} s, {report_peak:.0f} MB; training {train_text}')
    print(harness.benchmarks_row(what, ours, 'accounted epsilon',
                                 f'{best["fraction_of_accounted"]:.3f}; >= 0.5',
                                 'audit_bench'))


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
