r"""Round time of FedAvg with a BLT aggregator against the number of remote TFF workers.

One `tff.learning.algorithms.build_unweighted_fed_avg` process per model size (a dense Keras model
64 -> H -> H -> 10 with H chosen for about `--params` weights), with this project's
`CorrelatedNoiseFactory.blt` as `model_aggregator` (2 buffers, noise multiplier 1, clip 1, a fixed
noise seed; `clients_per_round` is the largest `--clients`: the mean's denominator does not change
the work). Every client holds `--examples_per_client` random examples (one batch).

Each entry of `--workers` runs in its own child process, in the given order, on the same data:
0 is the local anchor (TFF's default local C++ context: one `worker_binary` child of the driver), k
is TFF's mergeable context over the first k of `max(--workers)` loopback workers started by
`python -m experiments.workers start` (`dp_ftrl_tff.learning.remote_execution`). Per (model size,
clients, workers): `--rounds` timed rounds, after one warm-up round per model size (it compiles; the
first round of a later client count takes as long as the next ones); the tables give medians over
the timed rounds (and over `--repeats` passes). Figures per round:
  * wall seconds, and the ratio to the local anchor of the same run;
  * driver CPU seconds (the driver process, all its threads: it partitions the arguments, serializes
    the state and the client datasets once per worker, receives every partial aggregate);
  * workers' CPU seconds (utime + stime of the worker processes);
  * the mergeable context's phases, timed on the driver: `up` = first start to last end of the
    parallel "up to merge" calls (client work and partial sums on each worker), `merge` = the sum of
    the merge calls (each sends two partial aggregates to a worker and gets one back), `tail` = from
    the last "up to merge" end to the start of "after merge" (the merge work left on the critical
    path), `after` = the "after merge" call (the server step: BLT noise and the server optimizer).

The projection: for W machines like this one, each running its share of the c clients,
    T(W, c) = s + p*c/W + m*W,   fastest at W* = sqrt(p*c/m),
with s the server step, p the wall seconds per client on this machine and m what each worker adds.
`fit` reads each from the loopback runs where it is measured directly: p from the growth of the round
time between the smallest and the largest client count (median over the worker counts); m = the
driver's CPU seconds per added worker (slope over the worker counts, median over the client counts:
its share of the arguments, the state sent to it, its partial sum received, all serial in the
driver) + one merge call (median); s = the "after merge" call with the fewest workers (median). CPU
times and merge calls hold up on a busy machine, where wall-time slopes over the worker count do not
(more worker processes also win a larger share of a contended CPU). On loopback the client work does
not split (the workers share this machine's cores), so the printed check compares s + p*c + m*w with
the loopback rounds.

The projection ignores the network: across machines each worker also moves about 8 model sizes of
float32 per round (the whole server state in: weights, momentum and 2 BLT buffers; its partial sum
out; one merge: two partials in, one out), 32 * params / B seconds per worker on a link of B
bytes/s, which adds to m.

The default run (1e4 and 1e6 weights x 10, 100, 1000 clients, skipping 1e6 x 1000; 0-3 workers;
one timed round) takes about 5 minutes on 2 busy cores. The run of docs/benchmarks/distributed.md:

  tools/in_session.sh nice -n 10 .venv/bin/python -m experiments.benchmarks.workers_bench \
      --params=1e4,1e6 --clients=10,100,1000 --workers=0,1,2,3 --rounds=2 --repeats=2 \
      --max_client_params=1e9
"""

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

from absl import flags

from experiments.benchmarks import harness, workers_bench_child
from experiments.cli import flag_parsing
from experiments.workers import launcher as workers_launcher

FLAGS = flags.FlagValues()
_PARAMS = flags.DEFINE_list('params', ['1e4', '1e6'], 'Model sizes (weights, approximate: the '
                            'hidden width H is the closest to H^2 + 76 H + 10 = params).',
                            flag_values=FLAGS)
_CLIENTS = flags.DEFINE_list('clients', ['10', '100', '1000'], 'Clients per round.',
                             flag_values=FLAGS)
_WORKERS = flags.DEFINE_list('workers', ['0', '1', '2', '3'], 'Worker counts; 0 (the local anchor) '
                             'is required.', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 1, 'Timed rounds per setting (after one warm-up round per '
                               'model size).',
                               lower_bound=1, flag_values=FLAGS)
_REPEATS = harness.define_repeats(FLAGS, 1, 'Passes over the --workers children.')
_MAX_WORK = flags.DEFINE_float('max_client_params', 1e8, 'Skip the settings with clients x params '
                               'above this (memory and time: 1e6 x 1000 holds 1000 model-sized '
                               'client updates in a worker).', lower_bound=1, flag_values=FLAGS)
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 8, 'Examples per client (one batch).',
                                 lower_bound=1, flag_values=FLAGS)
_PORT = flags.DEFINE_integer('port', None, 'First port of the loopback workers (default: a free '
                             'range).', lower_bound=1, upper_bound=65535, flag_values=FLAGS)
_PROJECT = flags.DEFINE_list('project_machines', ['1', '2', '4', '8', '16', '32', '64'],
                             'Machine counts W of the projection.', flag_values=FLAGS)
_RESULTS_FILE = flags.DEFINE_string('results_file', None, 'Also write the results (every timed '
                                     'round) to this JSON file, after each child.',
                                     flag_values=FLAGS)
_REPORT_FROM = flags.DEFINE_string('report_from', None, 'Measure nothing: print the tables, the '
                                    'fit and the projection of a --results_file of an earlier run.',
                                    flag_values=FLAGS)
_CHILD = flags.DEFINE_string('child', None, 'Internal: one child\'s settings as JSON.',
                             flag_values=FLAGS)

def _parse_lists():
  """(params, clients, workers, machines) from the flags; ValueError (one line) when malformed."""
  def numbers(flag, convert, minimum):
    values = []
    for item in flag.value:
      try:
        value = convert(float(item))
      except (TypeError, ValueError, OverflowError):
        raise ValueError(f'`{flag.name}`: {item!r} is not a number.') from None
      if value < minimum or float(item) != value:
        raise ValueError(f'`{flag.name}`: {item!r} must be an integer >= {minimum}.')
      values.append(value)
    if not values:
      raise ValueError(f'`{flag.name}` must not be empty.')
    if len(set(values)) != len(values):
      raise ValueError(f'`{flag.name}` names a value twice.')
    return values

  params = numbers(_PARAMS, int, 100)
  clients = numbers(_CLIENTS, int, 1)
  workers = numbers(_WORKERS, int, 0)
  machines = numbers(_PROJECT, int, 1)
  if 0 not in workers:
    raise ValueError('`workers` must hold 0: the local anchor that the ratios divide by.')
  if max(workers) > 64:
    raise ValueError('`workers` must be at most 64.')
  if max(params) > 1e8:
    raise ValueError('`params` must be at most 1e8.')
  return params, sorted(clients), workers, machines


# ----------------------------------------------------------------------------------------------
# Parent: workers, children, tables, fit, projection.


class _Workers:
  """`python -m experiments.workers start` in the background: addresses and worker PIDs."""

  def __init__(self, count: int, port: int):
    self._state_dir = tempfile.mkdtemp(prefix='workers_bench_')
    self._launcher = subprocess.Popen(
        [sys.executable, '-m', 'experiments.workers', 'start', f'--count={count}', f'--port={port}',
         f'--state_dir={self._state_dir}'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    line = self._launcher.stdout.readline().strip()
    if not line.startswith('--workers='):
      self.stop()
      raise RuntimeError(f'the workers did not start: {self._launcher.stderr.read().strip()}')
    self.addresses = line[len('--workers='):].split(',')
    with open(os.path.join(self._state_dir, f'launcher-{self._launcher.pid}.json')) as f:
      self.pids = [w['pid'] for w in json.load(f)['workers']]

  def stop(self) -> None:
    if self._launcher.poll() is None:
      self._launcher.send_signal(signal.SIGTERM)
    try:
      self._launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
      self._launcher.kill()
      self._launcher.wait()
    shutil.rmtree(self._state_dir, ignore_errors=True)


def _run_children(params, clients, workers) -> list:
  """Runs one child per worker count and pass, each with fresh workers; returns their results."""
  results = []
  for repeat in range(_REPEATS.value):
    # Every other pass in reverse order, so that a drift of the machine's load hits all counts alike.
    for count in (workers if repeat % 2 == 0 else workers[::-1]):
      # Fresh workers per child: a worker keeps its peak memory after a round, and no child inherits
      # another's caches.
      pool = _Workers(count, _PORT.value or workers_launcher.free_port_range(count)) if count else None
      spec = {'workers': count, 'addresses': pool.addresses if pool else [],
              'worker_pids': pool.pids if pool else [], 'params': params, 'clients': clients,
              'rounds': _ROUNDS.value, 'examples': _EXAMPLES.value,
              'max_client_params': _MAX_WORK.value}
      try:
        timing = harness.timed(lambda s=spec: subprocess.run(
            [sys.executable, '-m', 'experiments.benchmarks.workers_bench',
             f'--child={json.dumps(s)}'], capture_output=True, text=True, check=False,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')))
      finally:
        if pool is not None:
          pool.stop()
      out = timing.value
      lines = [json.loads(line[len('RESULT '):]) for line in out.stdout.splitlines()
               if line.startswith('RESULT ')]
      print(f'# workers={count}: {len(lines)} settings in {timing.wall:.0f} s, '
            f'{harness.conditions()}', flush=True)
      if out.returncode != 0:
        print(f'# workers={count}: the child failed (exit {out.returncode}):\n'
              f'{out.stderr[-3000:]}', file=sys.stderr, flush=True)
      results.extend(lines)
      if _RESULTS_FILE.value:
        with open(_RESULTS_FILE.value, 'w') as f:
          json.dump(results, f, indent=1)
  return results


def _on_stop_signal(signum, unused_frame):
  raise SystemExit(128 + signum)  # unwinds: the running child is killed, its workers stopped


def _median(runs, key):
  values = [r[key] for run in runs for r in run['rounds'] if key in r]
  return statistics.median(values) if values else float('nan')


def _summaries(results) -> dict:
  """{(params, clients, workers): medians of the timed rounds over every repeat}."""
  grouped = {}
  for result in results:
    grouped.setdefault((result['params'], result['clients'], result['workers']), []).append(result)
  return {key: {'weights': runs[0]['weights'],
                'workers_peak_mib': max(r.get('workers_peak_mib', 0) for r in runs),
                **{k: _median(runs, k) for k in ('wall', 'cpu', 'workers_cpu', 'up', 'merge',
                                                 'merges', 'tail', 'after')}}
          for key, runs in grouped.items()}


def _slope(points) -> float:
  """Least-squares slope of y over x for [(x, y)] (at least 2 distinct x)."""
  mean_x = statistics.fmean(x for x, _ in points)
  mean_y = statistics.fmean(y for _, y in points)
  return (sum((x - mean_x) * (y - mean_y) for x, y in points)
          / sum((x - mean_x)**2 for x, _ in points))


def fit(settings: dict) -> dict:
  """The projection's parameters from one model size's remote settings {(w, c): medians}:
    p: wall seconds per client: the growth of the round time between the smallest and the largest
       client count, per client (median over the worker counts);
    driver: the driver's CPU seconds per added worker (slope over the worker counts, median over
       the client counts): serial work of the driver process for each worker (its share of the
       arguments, the state sent, its partial sum received);
    merge: seconds of one merge call (median of merge time / merge calls);
    m = driver + merge: what each worker adds to a round;
    s: the "after merge" call (the server step) with the fewest workers (median over the clients).
  Each is read where it is measured directly; CPU times and the merge calls hold up on a busy
  machine, where wall-time slopes over the worker counts do not.

  Raises:
    ValueError: fewer than 2 client counts, or fewer than 2 worker counts.
  """
  clients = sorted({c for _, c in settings})
  counts = sorted({w for w, _ in settings})
  if len(clients) < 2:
    raise ValueError('need 2 client counts')
  if len(counts) < 2:
    raise ValueError('need 2 worker counts')
  low, high = clients[0], clients[-1]
  per_client = statistics.median(
      (settings[(w, high)]['wall'] - settings[(w, low)]['wall']) / (high - low)
      for w in counts if (w, low) in settings and (w, high) in settings)
  driver = statistics.median(
      _slope([(w, settings[(w, c)]['cpu']) for w in counts if (w, c) in settings])
      for c in clients if sum((w, c) in settings for w in counts) >= 2)
  merges = [v['merge'] / v['merges'] for v in settings.values() if v['merges'] > 0]
  merge = statistics.median(merges) if merges else 0.0
  server = statistics.median(settings[(counts[0], c)]['after'] for c in clients
                             if (counts[0], c) in settings)
  return {'s': max(0.0, server), 'p': max(0.0, per_client), 'driver': max(0.0, driver),
          'merge': merge, 'm': max(0.0, driver) + merge}


def _print_report(summary, params, clients, workers, machines) -> None:
  """The benchmark's tables: wall times against the local anchor, the driver and merge costs, the
  fit of T(W, c) and its projection to `machines` machines."""
  _print_wall_times(summary, params, clients, workers)
  _print_costs(summary, params, clients, workers)
  fits = _print_fits(summary, params, clients, workers)
  if fits:
    _print_projection(summary, fits, clients, machines)


def _print_wall_times(summary, params, clients, workers) -> None:
  remote = sorted(w for w in workers if w)
  print('\n## Wall seconds per round (median of the timed rounds of every pass); ratio to the local '
        'anchor in parentheses')
  print('| params | clients | local | ' + ' | '.join(f'{w} worker{"s" * (w > 1)}' for w in remote)
        + ' |')
  print('|---|---|---|' + '---|' * len(remote))
  for p in params:
    for c in clients:
      local = summary.get((p, c, 0))
      if local is None:
        continue
      cells = []
      for w in remote:
        s = summary.get((p, c, w))
        cells.append('-' if s is None else
                     f'{s["wall"]:.3f} ({harness.ratio(s["wall"], local["wall"]):.2f})')
      print(f'| {local["weights"]:.3g} | {c} | {local["wall"]:.3f} | ' + ' | '.join(cells) + ' |')


def _print_costs(summary, params, clients, workers) -> None:
  print('\n## Driver and merge cost per round (seconds, medians; workers\' peak memory: the sum of '
        'their VmHWM so far in the child, settings run by growing size)')
  print('| params | clients | workers | wall | driver CPU | workers CPU | up | merge (calls) | '
        'tail | after | workers peak MiB |')
  print('|---|---|---|---|---|---|---|---|---|---|---|')
  for p in params:
    for c in clients:
      for w in sorted(workers):
        s = summary.get((p, c, w))
        if s is None:
          continue
        phases = ('| - | - | - | - |' if not w else
                  f'| {s["up"]:.3f} | {s["merge"]:.3f} ({s["merges"]:.0f}) | {s["tail"]:.3f} | '
                  f'{s["after"]:.3f} |')
        print(f'| {s["weights"]:.3g} | {c} | {w or "local"} | {s["wall"]:.3f} | {s["cpu"]:.3f} | '
              f'{s["workers_cpu"]:.3f} ' + phases + f' {s["workers_peak_mib"]:.0f} |')


def _print_fits(summary, params, clients, workers) -> dict:
  """Prints and returns the fit of each model size that has one: {params: `fit`'s parameters}."""
  remote = sorted(w for w in workers if w)
  print('\n## Fit: T(W, c) = s + p*c/W + m*W, m = driver CPU per worker + one merge call')
  fits = {}
  for p in params:
    settings = {(w, c): summary[(p, c, w)] for c in clients for w in remote
                if (p, c, w) in summary}
    weights = next(v['weights'] for k, v in summary.items() if k[0] == p)
    try:
      f = fits[p] = fit(settings)
    except ValueError as error:
      print(f'params {weights:.3g}: no fit ({error}).')
      continue
    # On loopback the client work does not split (all workers share this machine's cores).
    errors = [(f['s'] + f['p'] * c + f['m'] * w) / v['wall'] - 1 for (w, c), v in settings.items()]
    print(f'params {weights:.3g}: s = {f["s"]:.3f} s (after merge), p = {f["p"] * 1e3:.2f} '
          f'ms/client, m = {f["m"] * 1e3:.0f} ms/worker (driver CPU {f["driver"] * 1e3:.0f} + '
          f'merge call {f["merge"] * 1e3:.0f}); s + p*c + m*w against the {len(errors)} loopback '
          f'settings: {min(errors):+.0%} to {max(errors):+.0%}')
  return fits


def _print_projection(summary, fits, clients, machines) -> None:
  print('\n## Projection to W machines like this one (seconds per round; network transfer not '
        'included)')
  for p, f in fits.items():
    weights = next(v['weights'] for k, v in summary.items() if k[0] == p)
    print(f'params {weights:.3g}: T(W, c) = {f["s"]:.3f} + {f["p"]:.5f} * c / W + {f["m"]:.4f} * W')
    print('| clients | ' + ' | '.join(f'W={w}' for w in machines) + ' | W* = sqrt(p c / m) |')
    print('|---|' + '---|' * (len(machines) + 1))
    for c in sorted({*clients, 10 * max(clients)}):
      best = math.sqrt(f['p'] * c / f['m']) if f['m'] > 0 else float('inf')
      print(f'| {c} | ' + ' | '.join(f'{f["s"] + f["p"] * c / w + f["m"] * w:.2f}'
                                     for w in machines) + f' | {best:.1f} |')

def main(argv):
  del argv
  if _CHILD.value:
    workers_bench_child.run_child(json.loads(_CHILD.value))
    return
  try:
    params, clients, workers, machines = _parse_lists()
  except ValueError as error:
    flag_parsing.exit_with_error(error, FLAGS)
  if _REPORT_FROM.value:
    try:
      with open(_REPORT_FROM.value) as f:
        results = json.load(f)
      params = sorted({r['params'] for r in results})
      clients = sorted({r['clients'] for r in results})
      workers = sorted({r['workers'] for r in results})
      rounds = {len(r['rounds']) for r in results}
    except (OSError, ValueError, KeyError, TypeError) as error:
      flag_parsing.exit_with_error(f'cannot read `report_from` {_REPORT_FROM.value}: {error}',
                                   FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
    print(f'# workers_bench: the results of {_REPORT_FROM.value} ({len(results)} child settings, '
          f'{"/".join(map(str, sorted(rounds)))} timed rounds each)')
    _print_report(_summaries(results), params, clients, workers, machines)
    return
  print(f'# workers_bench: params {params}, clients {clients}, workers {workers}, '
        f'{_ROUNDS.value} timed rounds, {_REPEATS.value} pass(es); {harness.conditions()}',
        flush=True)
  # Stop cleanly on SIGTERM, and on SIGINT even when started in the background (which ignores it).
  signal.signal(signal.SIGTERM, _on_stop_signal)
  signal.signal(signal.SIGINT, _on_stop_signal)
  try:
    results = _run_children(params, clients, workers)
  except (RuntimeError, OSError) as error:
    flag_parsing.exit_with_error(error, FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  print(f'# done; {harness.conditions()}')
  _print_report(_summaries(results), params, clients, workers, machines)


if __name__ == '__main__':
  harness.run(main, FLAGS, __doc__)
