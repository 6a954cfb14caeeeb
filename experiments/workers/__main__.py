r"""Starts, lists and stops local TFF workers (TFF's C++ `worker_binary`) for `--workers`.

  python -m experiments.workers start --count=2 --port=8000   # runs until stop / Ctrl-C / SIGTERM
  python -m experiments.workers status                        # the launchers and their workers
  python -m experiments.workers stop [--port=8000]            # stops launchers (all, or one's)

`start` launches N workers on ports P..P+N-1 (TFF's `tensorflow_federated/data/worker_binary
--port=...`), waits until each accepts connections, prints their addresses as one
`--workers=host:port,...` line, and stays in the foreground. It stops them on `stop`, Ctrl-C,
SIGTERM or its own exit. No worker outlives its launcher: every worker is started with the Linux
parent-death signal set to SIGKILL, so it ends even when the launcher is killed with SIGKILL. A worker
that exits on its own is reported on stderr (a driver using it retries its round on the others).

Each running launcher is recorded in --state_dir (`launcher-PID.json`: its PID and start time, the
workers' PIDs and addresses); `status` and `stop` read these records and ignore stale ones.
Security: a worker serves insecure gRPC on all interfaces and runs any computation sent to it; keep
it on a private network (docs/distributed.md). Exit status: 2 on bad flags, 1 on a runtime failure
(a port in use, a worker that does not start), with one line on stderr.
"""

import os
import sys
import tempfile

from absl import app, flags

from experiments.cli import flag_parsing
from experiments.workers import launcher

COMMANDS = ('start', 'status', 'stop')

FLAGS = flags.FlagValues()
_d = dict(flag_values=FLAGS)
flags.DEFINE_integer('count', 1, 'start: number of workers.', lower_bound=1, upper_bound=64, **_d)
flags.DEFINE_integer('port', None, 'start: first port (workers use port..port+count-1); stop: stop '
                     'only the launcher serving this port.', lower_bound=1, upper_bound=65535, **_d)
flags.DEFINE_string('host', 'localhost', 'start: the host name printed in the addresses (workers '
                    'listen on all interfaces).', **_d)
flags.DEFINE_float('wait_seconds', 60.0, 'start: how long to wait for each worker to answer.',
                   lower_bound=0.1, **_d)
flags.DEFINE_integer('max_concurrent_computation_calls', -1, 'start: passed to each worker: the '
                     'parallel calls per computation (non-positive: no limit).', **_d)
flags.DEFINE_string('state_dir', os.path.join(tempfile.gettempdir(), 'dp_ftrl_tff_workers'),
                    'Where running launchers are recorded.', **_d)


def main(argv):
  try:
    if len(argv) != 2 or argv[1] not in COMMANDS:
      raise ValueError(f'give one command of {", ".join(COMMANDS)}, got {argv[1:]}.')
    command = argv[1]
    if command == 'start':
      if FLAGS.port is None:
        raise ValueError('`port` is required by start.')
      code = launcher.start(FLAGS.count, FLAGS.port, FLAGS.host, FLAGS.wait_seconds,
                            FLAGS.max_concurrent_computation_calls, FLAGS.state_dir)
    elif command == 'status':
      code = launcher.status(FLAGS.state_dir)
    else:
      code = launcher.stop(FLAGS.state_dir, FLAGS.port)
  except ValueError as error:
    flag_parsing.exit_with_error(error, FLAGS)
  except (RuntimeError, OSError) as error:
    flag_parsing.exit_with_error(error, FLAGS, flag_parsing.RUNTIME_ERROR_EXIT_CODE)
  sys.exit(code)


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
