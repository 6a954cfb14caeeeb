"""A script that runs TFF computations ends with no TFF `worker_binary` left: TFF's local C++
context starts one that would outlive the script, holding its stdout (`python my_loop.py | tail`
would wait for it). Each case is a subprocess whose stdout is a pipe: reading it to the end returns
only once every process holding it has exited."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_COMPUTATION = textwrap.dedent('''
    import tensorflow as tf
    import tensorflow_federated as tff
    from dp_ftrl_tff.learning import worker_processes

    @tff.tensorflow.computation(tf.int32)
    def double(x):
      return x * 2
    ''')


@pytest.mark.parametrize('ending', [
    'with worker_processes.ending_child_workers():\n  print(double(21), flush=True)\n',
    'worker_processes.register_at_exit()\nprint(double(21), flush=True)\n',
], ids=['context_manager', 'at_exit'])
def test_the_pipe_closes_when_the_script_ends(ending):
  script = subprocess.Popen([sys.executable, '-c', _COMPUTATION + ending], cwd=_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  try:
    out, _ = script.communicate(timeout=120)  # returns once the pipe's last writer exited
  finally:
    script.kill()
  assert script.returncode == 0
  assert out.decode().strip().splitlines()[-1] == '42'
