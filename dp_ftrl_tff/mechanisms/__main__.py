"""`python -m dp_ftrl_tff.mechanisms optimize|evaluate|amplified|select_bands [flags]`.

The mechanisms CLI is a binary like the others (`experiments/mechanisms_cli.py`: its flags, which it
shares with the drivers and the privacy report, and its amplified commands, which need the
accountant). This entry point runs it by module name, so that `dp_ftrl_tff.mechanisms` imports
nothing from the layers above it.
"""

import runpy

if __name__ == '__main__':
  runpy.run_module('experiments.mechanisms_cli', run_name='__main__', alter_sys=True)
