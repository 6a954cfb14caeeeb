"""Sweep runner: `python -m experiments.sweeps.run_sweep --driver=emnist --grid=...
--root_output_dir=ROOT [-- driver flags]`.

Runs one driver (`experiments/emnist/run_emnist.py` or `experiments/stackoverflow/
run_stackoverflow.py`) per point of a grid of flag values (`experiments.sweeps.sweep_grid`: `--grid`
text or a `--grid_file` JSON), `--parallel` points at a time, each as a subprocess writing its own run
directory `ROOT/<point name>` (e.g. `ROOT/noise_multiplier=0.5,mechanism=blt`). The flags after `--`
go to every point (the grid's values come after them and win); `--root_output_dir` and
`--experiment_name` are the sweep's.

Every point is checked before anything runs, with the driver's own flags and settings checks: a bad
flag name or value is one line on stderr and exit status 2. Then each point is:
  * skipped if its directory holds a finished run of exactly those settings (`summary.json`, the
    completion marker of `dp_ftrl_tff.training.run_summary`, for the same `--rounds`);
  * failed at once (without running) if its directory holds a run with other settings
    (`run_config.check_hparams`);
  * otherwise run: a fresh start, or the resume of an interrupted run from its last checkpoint (the
    driver resumes by itself; a finished run given more `--rounds` is extended).
A point's stdout and stderr are appended to `<run directory>/sweep.log`. A failed point is one line
(`sweep: FAILED <name> (exit <status>): <its last stderr line>`) and the sweep goes on; the exit
status is 1 if any point failed, else 0.

Ctrl-C (SIGINT) or SIGTERM: no new point starts; the running drivers get SIGINT, finish their current
round, checkpoint and exit (a second signal stops them at once, from their last checkpoint); the sweep
then exits with 130 / 143 and rerunning the same command resumes them. Each driver runs in its own
Unix session, and whatever is left in that session when it exits (TFF `worker_binary` processes of a
crashed driver) is ended, so an interrupted sweep leaves no process behind.
"""

import copy
import os

# Quiet console: TensorFlow's C++ logs off (the sweep imports the driver to check its points, and the
# drivers inherit the setting) unless the user set TF_CPP_MIN_LOG_LEVEL.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
if __name__ == '__main__':  # SIGINT / SIGTERM recorded from the start (dp_ftrl_tff.training.stop_signals)
  from dp_ftrl_tff.training import stop_signals as _stop_signals
  _stop_signals.record_early()

# ruff: noqa: E402
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from absl import app, flags

from dp_ftrl_tff.training import run_summary, stop_signals
from experiments.cli import flag_parsing
from experiments.sweeps import sweep_grid

#: --driver -> the driver's module.
DRIVERS = {'emnist': 'experiments.emnist.run_emnist',
           'stackoverflow': 'experiments.stackoverflow.run_stackoverflow'}
LOG_FILE = 'sweep.log'
_POLL_SECONDS = 0.2

FLAGS = flags.FlagValues()
flags.DEFINE_enum('driver', None, list(DRIVERS), 'The driver every point runs (required).',
                  flag_values=FLAGS)
flags.DEFINE_string('grid', None, 'Grid of flag values, "name=v1,v2;name2=w1,w2" (the Cartesian '
                    'product); excludes --grid_file.', flag_values=FLAGS)
flags.DEFINE_string('grid_file', None, 'JSON grid: {"name": [values], ...} or a list of such '
                    'objects (the union of their products); excludes --grid.', flag_values=FLAGS)
flags.DEFINE_integer('parallel', 1, 'Points run at a time (each driver uses the CPU cores TF gives '
                     'it; on 2 cores, 1 or 2).', lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string('root_output_dir', None, 'Root of the sweep: one run directory per point '
                    '(required).', flag_values=FLAGS)


class Point:
  """One grid point: its flags, run directory, settings and (while it runs) its process."""

  def __init__(self, values: sweep_grid.Point, root: str, driver_args: List[str], rounds: int,
               check_settings):
    self.values = values
    self.name = sweep_grid.point_name(values)
    self.output_dir = os.path.join(root, self.name)
    self.args = [*driver_args, *sweep_grid.point_flags(values), f'--root_output_dir={root}',
                 f'--experiment_name={self.name}']
    self.rounds = rounds
    self.check_settings = check_settings  # raises ValueError if the directory holds other settings
    self.process: Optional[subprocess.Popen] = None
    self.started = 0.0

  def state(self) -> str:
    """'complete', 'resume' (a checkpoint but no summary for these rounds) or 'new'."""
    if run_summary.is_complete(self.output_dir):
      try:
        if run_summary.read_summary(self.output_dir).get('rounds') == self.rounds:
          return 'complete'
      except Exception:  # a corrupt summary: the driver rewrites it
        pass
      return 'resume'
    if os.path.isdir(os.path.join(self.output_dir, 'checkpoints')):
      return 'resume'
    return 'new'


def _say(message: str) -> None:
  print(f'sweep: {message}', flush=True)


def _driver_checker(driver: str):
  """(point args -> (rounds, settings check)) for `driver`, from the driver's own flags and
  `RunConfig` checks; imports the driver (and TensorFlow) once."""
  import importlib

  module = importlib.import_module(DRIVERS[driver])
  from dp_ftrl_tff.training import run_config
  from experiments.run import driver_flags

  def check(args: Sequence[str]):
    values = copy.deepcopy(module.FLAGS)
    try:
      rest = values([DRIVERS[driver], *args])
      if len(rest) > 1:
        raise ValueError(f'unexpected driver arguments {rest[1:]} (flags must be --name=value)')
      config = driver_flags.config_from_flags(values, module.task_settings(values))
    except (flags.Error, ValueError) as error:
      point = ' '.join(arg for arg in args if not arg.startswith(('--root_output_dir=',
                                                                  '--experiment_name=')))
      raise ValueError(f'the driver rejects the point {point}: '
                       f'{flag_parsing.error_line(error, values)}') from error

    def check_settings():
      run_config.check_hparams(config, config.output_dir)
    return config.rounds, check_settings

  return check


def _last_line(path: str) -> str:
  """The last non-blank line of the log at `path` (the driver's one-line error), or ''."""
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, os.path.getsize(path) - 8192))
      lines = f.read().decode('utf-8', 'replace').splitlines()
  except OSError:
    return ''
  return next((line.strip() for line in reversed(lines) if line.strip()), '')


def _session_pids(session: int) -> List[int]:
  """The PIDs of the live processes in Unix session `session` (Linux /proc)."""
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        fields = f.read().decode(errors='replace').rsplit(')', 1)[1].split()
    except (OSError, IndexError):
      continue
    if fields[0] != 'Z' and int(fields[3]) == session:  # state, ppid, pgrp, session
      pids.append(int(entry))
  return pids


def _end_session(session: int) -> None:
  """SIGKILLs what is left in a finished driver's session (its orphaned worker_binary, if any)."""
  for pid in _session_pids(session):
    try:
      os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass


class Sweep:
  """Runs the points, `parallel` at a time; forwards stop signals to the running drivers."""

  def __init__(self, points: List[Point], driver: str, parallel: int):
    self.points = points
    self.module = DRIVERS[driver]
    self.parallel = parallel
    self.running: Dict[int, Point] = {}
    self.stop_signum: Optional[int] = None
    self.counts = {'done': 0, 'skipped': 0, 'failed': 0, 'stopped': 0}

  def _on_signal(self, signum, frame) -> None:
    del frame
    first = self.stop_signum is None
    self.stop_signum = signum
    if first:
      _say(f'{stop_signals.signal_name(signum)}: no new point starts; the {len(self.running)} '
           'running point(s) finish their current round and checkpoint (signal again to stop them '
           'at once).')
    for point in self.running.values():
      try:
        os.kill(point.process.pid, signal.SIGINT)
      except ProcessLookupError:
        pass

  def _start(self, point: Point, state: str) -> None:
    os.makedirs(point.output_dir, exist_ok=True)
    with open(os.path.join(point.output_dir, LOG_FILE), 'ab') as log:
      log.write(f'\n=== sweep {time.strftime("%Y-%m-%d %H:%M:%S")}: python -m {self.module} '
                f'{" ".join(point.args)}\n'.encode())
      log.flush()
      point.process = subprocess.Popen([sys.executable, '-m', self.module, *point.args],
                                       stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
    point.started = time.time()
    self.running[point.process.pid] = point
    _say(f'{"resuming" if state == "resume" else "started"} {point.name} (PID {point.process.pid})')

  def _finish(self, point: Point, status: int) -> None:
    del self.running[point.process.pid]
    _end_session(point.process.pid)  # start_new_session: the session id is the driver's PID
    seconds = time.time() - point.started
    if status == 0 and run_summary.is_complete(point.output_dir):
      self.counts['done'] += 1
      _say(f'done {point.name} in {seconds:.1f} s')
    elif self.stop_signum is not None and status in (130, 143, -signal.SIGINT, -signal.SIGTERM):
      self.counts['stopped'] += 1
      _say(f'stopped {point.name} after {seconds:.1f} s (checkpointed; rerun to resume)')
    else:
      self.counts['failed'] += 1
      why = _last_line(os.path.join(point.output_dir, LOG_FILE)) or 'no output'
      if status == 0:
        why = f'exited 0 without writing {run_summary.SUMMARY_FILE}'
      _say(f'FAILED {point.name} (exit {status}): {why} [log: '
           f'{os.path.join(point.output_dir, LOG_FILE)}]')

  def run(self) -> int:
    """Runs the sweep; returns the exit status (0, 1 if a point failed, 128 + signal if stopped)."""
    previous = {s: signal.signal(s, self._on_signal) for s in stop_signals.SIGNALS}
    try:
      pending = list(self.points)
      while pending or self.running:
        while pending and len(self.running) < self.parallel and self.stop_signum is None:
          point = pending.pop(0)
          try:  # a directory holding a run of other settings is neither skipped nor run
            point.check_settings()
          except ValueError as error:
            self.counts['failed'] += 1
            _say(f'FAILED {point.name} (not run): {flag_parsing.error_line(error, FLAGS)}')
            continue
          except Exception as error:  # a corrupt hparams.json: one line, like the driver's
            self.counts['failed'] += 1
            _say(f'FAILED {point.name} (not run): {error}')
            continue
          state = point.state()
          if state == 'complete':
            self.counts['skipped'] += 1
            _say(f'skipped {point.name} (complete: {run_summary.SUMMARY_FILE})')
            continue
          self._start(point, state)
        if self.stop_signum is not None and not self.running:
          break
        for point in list(self.running.values()):
          status = point.process.poll()
          if status is not None:
            self._finish(point, status)
        time.sleep(_POLL_SECONDS)
    finally:
      for point in list(self.running.values()):  # only on an error of the sweep itself
        point.process.kill()
        point.process.wait()
        _end_session(point.process.pid)
      for signum, handler in previous.items():
        signal.signal(signum, handler)
    not_started = len(self.points) - sum(self.counts.values())
    _say(f'{len(self.points)} point(s): {self.counts["done"]} done, {self.counts["skipped"]} '
         f'skipped (complete), {self.counts["failed"]} failed, {self.counts["stopped"]} stopped, '
         f'{not_started} not started.')
    if self.stop_signum is not None:
      return 128 + self.stop_signum
    return 1 if self.counts['failed'] else 0


def build_points(root: str, driver: str, grid: Optional[str], grid_file: Optional[str],
                 driver_args: Sequence[str]) -> List[Point]:
  """The sweep's points, each checked with the driver's flags and settings.

  Raises:
    ValueError: no or two grid sources, a bad grid, a passed-through argument that is not a flag or
      is a reserved one, or a point the driver would reject (bad flag name or value).
  """
  if (grid is None) == (grid_file is None):
    raise ValueError('give exactly one of `grid` and `grid_file`.')
  values = sweep_grid.parse_grid_text(grid) if grid is not None else sweep_grid.load_grid_file(
      grid_file)
  sweep_grid.check_unique_names(values)
  for arg in driver_args:
    name = arg.lstrip('-').split('=', 1)[0]
    if not arg.startswith('--'):
      raise ValueError(f'driver argument {arg!r} after "--" is not a --flag.')
    if name in sweep_grid.RESERVED_FLAGS:
      raise ValueError(f'driver arguments may not set --{name}: the sweep sets it for every point.')
  check = _driver_checker(driver)
  points = []
  for point_values in values:
    args = [*driver_args, *sweep_grid.point_flags(point_values)]
    rounds, check_settings = check([*args, f'--root_output_dir={root}',
                                    f'--experiment_name={sweep_grid.point_name(point_values)}'])
    points.append(Point(point_values, root, list(driver_args), rounds, check_settings))
  return points


def main(argv, driver_args: Sequence[str]) -> None:
  if len(argv) > 1:
    flag_parsing.exit_with_error(f'unexpected arguments {argv[1:]} (driver flags go after "--")',
                                 FLAGS)
  # A signal while the points are checked is recorded and ends the sweep after the checks (none
  # started); `Sweep.run` handles its own.
  with stop_signals.StopSignals(exit_on_second=True):
    _main(driver_args)


def _main(driver_args: Sequence[str]) -> None:
  try:
    if FLAGS.driver is None:
      raise ValueError('`driver` is required (emnist or stackoverflow).')
    if not FLAGS.root_output_dir:
      raise ValueError('`root_output_dir` is required.')
    root = os.path.abspath(FLAGS.root_output_dir)
    points = build_points(root, FLAGS.driver, FLAGS.grid, FLAGS.grid_file, driver_args)
    stop_signals.check()
  except ValueError as error:
    flag_parsing.exit_with_error(error, FLAGS)
  except stop_signals.Interrupted as stopped:
    flag_parsing.exit_now(stopped.exit_code)
  except Exception as error:  # a broken driver import, I/O: one line, exit 1
    flag_parsing.exit_with_error(f'cannot check the points: {type(error).__name__}: {error}',
                                 FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  _say(f'{len(points)} point(s) of {FLAGS.driver} under {root}, {FLAGS.parallel} at a time')
  try:
    os.makedirs(root, exist_ok=True)
    status = Sweep(points, FLAGS.driver, FLAGS.parallel).run()
  except OSError as error:
    flag_parsing.exit_with_error(f'I/O error ({error.filename}): {error.strerror or error}', FLAGS,
                                 flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  flag_parsing.exit_now(status)


def run_cli(argv: Sequence[str]) -> None:
  """Entry point: `argv` up to `--` holds the sweep's flags, after it the drivers'."""
  argv = list(argv)
  split = argv.index('--') if '--' in argv else len(argv)
  driver_args = argv[split + 1:]
  app.run(lambda own: main(own, driver_args), argv=argv[:split],
          flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))


if __name__ == '__main__':
  run_cli(sys.argv)
