"""`python -m dp_ftrl_tff.mechanisms optimize|evaluate [flags]`; see `cli`."""

import sys

from dp_ftrl_tff.mechanisms import cli

if __name__ == '__main__':
  sys.exit(cli.main(sys.argv))
