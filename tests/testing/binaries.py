"""The one harness for the project's binaries: as a subprocess, or in-process through their `main`.

* `run(module, args, directory)` (or `run_process`, the same as a `CompletedProcess`): `python -m
  module args` in a subprocess, stdout and stderr redirected to files in `directory` (an orphaned
  TFF worker_binary would keep a pipe open), stdin closed. For what only a process shows: exit
  codes as the shell sees them, signals, TF's C++ log noise, files left on disk.
* `RunningBinary`: a driver or the example program running, for kill, resume and concurrency tests.
* `run_in_process(module, args)`: the binary's own entry point in this process, with stdout and
  stderr captured and its process exit turned into the returned code. For error contracts: the same
  parsing, validation and one-line message as the binary, without an interpreter start per case.
"""

import contextlib
import io
import logging as std_logging
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EMNIST = 'experiments.emnist.run_emnist'
SO = 'experiments.stackoverflow.run_stackoverflow'
MECH = 'experiments.mechanisms_cli'
REPORT = 'experiments.privacy_report'
DEMO = 'experiments.demo'
TASK = 'experiments.run_task'
DRIVERS = (EMNIST, SO)


def env(module: str, **extra) -> dict:
  """The environment of a binary's subprocess: the drivers and the demo run without
  TF_CPP_MIN_LOG_LEVEL (they must be quiet on their own), and `extra` variables are added."""
  environment = dict(os.environ)
  if module in DRIVERS + (DEMO, TASK):
    environment.pop('TF_CPP_MIN_LOG_LEVEL', None)
  environment.update(extra)
  return environment


def command(module: str, args) -> list:
  return [sys.executable, '-m', module, *map(str, args)]


def run(module: str, args, directory=None, timeout: float = 300, **extra_env):
  """Runs `python -m module args`; returns (exit code, stdout text, stderr text). The output files
  are `directory`/stdout.txt and stderr.txt (a temporary directory when None)."""
  proc = run_process(module, args, directory, timeout, **extra_env)
  return proc.returncode, proc.stdout, proc.stderr


def run_process(module: str, args, directory=None, timeout: float = 300,
                **extra_env) -> subprocess.CompletedProcess:
  """`run` as a `subprocess.CompletedProcess` (returncode, stdout, stderr as text)."""
  with contextlib.ExitStack() as stack:
    if directory is None:
      directory = stack.enter_context(tempfile.TemporaryDirectory())
    directory = os.fspath(directory)
    out_path = os.path.join(directory, 'stdout.txt')
    err_path = os.path.join(directory, 'stderr.txt')
    with open(out_path, 'w') as out, open(err_path, 'w') as err:
      proc = subprocess.run(command(module, args), cwd=ROOT, stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL, timeout=timeout,
                            env=env(module, **extra_env))
    with open(out_path) as out, open(err_path) as err:
      return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


@contextlib.contextmanager
def _process_state(program: str, args):
  """What a binary may change in its process, restored afterwards: argv, the exit path (os._exit
  becomes SystemExit), SIGINT / SIGTERM handlers, logging levels and handler formats."""
  from experiments.cli import flag_parsing

  def exit_now(exit_code, stderr_text=''):
    sys.stdout.flush()
    sys.stderr.write(stderr_text)
    raise SystemExit(exit_code)

  saved_argv, saved_exit = sys.argv, flag_parsing.exit_now
  saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  loggers = [std_logging.getLogger(), std_logging.getLogger('absl'),
             std_logging.getLogger('tensorflow')]
  saved_levels = [(lg, lg.level) for lg in loggers]
  saved_formats = [(h, h.formatter) for lg in loggers for h in lg.handlers]
  sys.argv = [program, *map(str, args)]
  flag_parsing.exit_now = exit_now
  try:
    yield
  finally:
    sys.argv, flag_parsing.exit_now = saved_argv, saved_exit
    for signum, handler in saved_signals.items():
      signal.signal(signum, handler)
    for lg, level in saved_levels:
      lg.setLevel(level)
    for handler, formatter in saved_formats:
      handler.setFormatter(formatter)


def _entry_point(module: str):
  """(program file name, callable running the binary as its `__main__` does, its FlagValues)."""
  if module in DRIVERS + (TASK,):
    from experiments.run import driver
    binary = __import__(module, fromlist=['FLAGS'])
    return (f'{module.rsplit(".", 1)[-1]}.py',
            lambda: driver.run_main(binary.FLAGS, binary.build_task, binary.task_settings,
                                    binary.__doc__), binary.FLAGS)
  if module == REPORT:
    from experiments import privacy_report
    from experiments.cli import flag_parsing

    def report_main():
      argv = flag_parsing.flags_parser(privacy_report.FLAGS, privacy_report.__doc__)(sys.argv)
      sys.exit(privacy_report.main(argv))
    return 'privacy_report.py', report_main, privacy_report.FLAGS
  if module == DEMO:
    from experiments import demo
    return 'demo.py', demo.run, demo.FLAGS
  if module == MECH:
    from experiments import mechanisms_cli
    return ('mechanisms_cli.py', lambda: sys.exit(mechanisms_cli.main(sys.argv)),
            mechanisms_cli._FLAGS)  # pylint: disable=protected-access
  raise ValueError(f'module: no in-process entry point for {module!r}')


def run_in_process(module: str, args, files: bool = False):
  """Runs the binary `module` on `args` in this process; returns (exit code, stdout, stderr).

  The exit code is what the process would exit with (0 when `main` returns normally). Only what
  the binary writes through `sys.stdout` / `sys.stderr` while it runs is captured, in memory or,
  with `files`, in temporary files (a run that trains needs them: TFF starts its worker_binary with
  `sys.stdout` as its output, which must have a file descriptor).
  """
  program, main, flag_values = _entry_point(module)
  make = (lambda: tempfile.TemporaryFile('w+')) if files else io.StringIO  # noqa: E731
  code = 0
  with make() as out, make() as err:
    with _process_state(program, args), contextlib.redirect_stdout(out), \
        contextlib.redirect_stderr(err):
      try:
        main()
      except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
      finally:
        flag_values.unparse_flags()
    out.seek(0)
    err.seek(0)
    return code, out.read(), err.read()


class RunningBinary:
  """A driver or the example program as a subprocess on `<root>/<name>`, for kill, resume and
  concurrency tests: stdout and stderr in `<root>/<log_name>.stdout|.stderr`; it records the
  worker_binary children (pid, start time) it sees while waiting, so a test can check none is left.
  """

  def __init__(self, module, root, name, args, log_name=None, timeout=600):
    self.dir = os.path.join(str(root), name)
    self.err_path = os.path.join(str(root), f'{log_name or name}.stderr')
    self.out_path = os.path.join(str(root), f'{log_name or name}.stdout')
    self.timeout = timeout
    with open(self.err_path, 'w') as err, open(self.out_path, 'w') as out:
      self.proc = subprocess.Popen(
          command(module, [f'--root_output_dir={root}', f'--experiment_name={name}', *args]),
          stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=ROOT,
          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    self.workers = set()

  @property
  def pid(self):
    return self.proc.pid

  def poll_workers(self):
    from dp_ftrl_tff.learning import worker_processes
    for pid in worker_processes.child_worker_pids(self.proc.pid):
      start = worker_processes.start_time(pid)
      if start is not None:
        self.workers.add((pid, start))

  def wait_for(self, condition, what):
    """Polls until `condition()`; fails if the binary exits first."""
    deadline = time.time() + self.timeout
    while not condition():
      self.poll_workers()
      assert self.proc.poll() is None, f'exited ({self.proc.returncode}) before {what}:\n' \
                                       f'{self.stderr()[-3000:]}'
      assert time.time() < deadline, f'timeout waiting for {what}'
      time.sleep(0.05)

  def wait(self):
    deadline = time.time() + self.timeout
    while self.proc.poll() is None:
      self.poll_workers()
      assert time.time() < deadline, 'binary timeout'
      time.sleep(0.1)
    return self.proc.returncode

  def stderr(self):
    with open(self.err_path) as f:
      return f.read()

  def stdout(self):
    with open(self.out_path) as f:
      return f.read()

  def checkpoint_exists(self, rounds):
    """Whether the checkpoint after `rounds` rounds and its record exist (a checkpoint counts on
    resume once its record is written: dp_ftrl_tff/training/checkpoint_records.py)."""
    checkpoints = os.path.join(self.dir, 'checkpoints')
    return (os.path.isdir(os.path.join(checkpoints, f'program_state_{rounds}'))
            and os.path.isfile(os.path.join(checkpoints, f'record_{rounds}.json')))


def alive_workers(workers):
  """The (pid, start time) pairs of `workers` still running (a reused pid has another start)."""
  from dp_ftrl_tff.learning import worker_processes
  return [pid for pid, start in workers if worker_processes.start_time(pid) == start]


def assert_no_workers_left(workers):
  deadline = time.time() + 10  # SIGKILLed processes vanish asynchronously
  while alive_workers(workers) and time.time() < deadline:
    time.sleep(0.1)
  assert not alive_workers(workers), f'worker_binary processes left: {alive_workers(workers)}'
