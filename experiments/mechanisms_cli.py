r"""Strategies (DP-FTRL noise mechanisms): optimize, evaluate, amplified epsilon, band selection.

Usage: `python -m experiments.mechanisms_cli optimize|evaluate|amplified|select_bands [flags]`.

  optimize --mechanism=blt --rounds=N --min_sep=B [--max_participations=K] [--num_buffers=D]
           [--error=max|rms] [--output=FILE.json] [--json]
  optimize --mechanism=banded --rounds=N [--num_bands=H] [--toeplitz] --min_sep=B
           [--max_participations=K] [--error=rms|max] [--output=FILE.npz] [--json]
  optimize --mechanism=bsr|bisr --rounds=N --min_sep=B [--num_bands=H] [--output=FILE.json]
           (closed forms: builds the strategy for the setting, default H = min(min_sep, rounds))
  evaluate --mechanism=gaussian|tree|tree_efficient|tree_full|banded|blt|bsr|bisr --rounds=N
           --min_sep=B [--max_participations=K] [--theta=a,b --omega=c,d | --num_bands=H |
           --completion | --mechanism_file=F] [--json]
  amplified --rounds=N --sampling_groups=H (--sampling_prob=Q | --dataset_size=M --batch_size=B)
           (--noise_multiplier=S | --target_epsilon=E) [--target_delta=D] [--accountant=pld|rdp]
           [--mechanism_file=F | --mechanism=gaussian] [--json]
  select_bands --rounds=N --dataset_size=M --batch_size=B --target_epsilon=E [--target_delta=D]
           [--accountant=pld|rdp] [--error=rms|max] [--candidates=all|pow2|H1,H2,...]
           [--output=FILE.npz] [--json]

Conventions: rounds are 0-based; `--min_sep` = b is the BLT/BandMF min-sep (TF-Privacy's
min_separation + 1); `--max_participations` = k defaults to ceil(n / b), and the printed value is the
effective k = min(k, ceil(n / b)). `--min_sep=1 --max_participations=1` is single participation;
`--fixed_epoch` selects (k, b) fixed-epoch participation. Losses use clip norm 1 and noise
multiplier 1 (BLT paper Eq. 9-10). Without `--num_buffers` the BLT optimizer tries 1 .. 8 buffers
and keeps the smallest count within 0.05% of the best loss. The mechanism flags (`--mechanism`, its
options, `--mechanism_file`) are those of the drivers and the privacy report.

Amplification (BandMF paper Sec. 5, App. F): the population of M is split into
H = `--sampling_groups` groups, round t samples group t mod H, each member with probability Q
(`--sampling_prob`, or B / floor(M / H) from `--dataset_size` and `--batch_size`).
`amplified` prints epsilon (or the calibrated sigma) of ceil(N / H) Poisson-sampled Gaussian rounds,
with sigma relative to a largest column norm of 1, or to the strategy's with `--mechanism_file`
(which must have at most H bands). `select_bands` picks the H in 1 .. floor(M / B) minimizing
sigma(H) * RmsLoss(H) of the optimized H-banded strategy (among `--candidates`: every H by default,
the powers of two with pow2, or a list) and prints the candidate set and every evaluated candidate;
`--output` saves the chosen strategy.

Example (the BLT paper's production setting, a few seconds):
  python -m experiments.mechanisms_cli optimize --mechanism=blt --rounds=2000 --min_sep=400 \
      --max_participations=5 --num_buffers=4

Exit codes: 0 ok; 2 on a user mistake (bad or conflicting flags, a missing, corrupt or wrongly
typed `--mechanism_file`, a size whose arrays cannot fit in memory or whose optimization or
accounting would take over an hour, e.g. --num_buffers=1000); 1 on a runtime
failure (an unwritable `--output`, I/O errors). Either way one line `error: ...` on stderr naming
the flag; `--debug` prints the traceback before it.
Docs: docs/ARCHITECTURE.md (mechanisms), docs/amplification.md (amplified, select_bands).
"""

# For developers: the mechanism flags are `experiments.cli.plan_flags` (shared with the drivers and
# the privacy report); a strategy is resolved as everywhere else (`dp_ftrl_tff.mechanisms.resolve`);
# the rounds' memory check is `memory.check_fits`; amplification is
# `dp_ftrl_tff.accounting.amplification`, band selection `dp_ftrl_tff.accounting.band_selection`,
# and the amplified commands are `experiments.cli.amplified_commands`.

import json
import sys
import traceback
from typing import Sequence

from absl import flags

from dp_ftrl_tff.mechanisms import base, commands, memory, registry, resolve
from experiments.cli import amplified_commands, flag_parsing, plan_flags
from experiments.cli.amplified_commands import RuntimeFailure, UsageError, forbid, require

#: The name in this CLI's error lines (`mechanisms: error: ...`).
PROGRAM = 'mechanisms'
COMMANDS = ('optimize', 'evaluate', 'amplified', 'select_bands')

_FLAGS = flags.FlagValues()
# `evaluate` evaluates a strategy file at any setting (what it is for): no setting check to allow.
plan_flags.define_mechanism_flags(_FLAGS, setting_check=False)
plan_flags.define_setting_flags(_FLAGS, fixed_epoch=True)
flags.DEFINE_string('output', None, 'Save the optimized strategy here (.json blt, .npz banded).',
                    flag_values=_FLAGS)
amplified_commands.define_flags(_FLAGS)
flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.', flag_values=_FLAGS)
flags.DEFINE_bool('debug', False, 'On an error, print the traceback before the one-line message.',
                  flag_values=_FLAGS)

USAGE_EXIT_CODE = flag_parsing.ERROR_EXIT_CODE
RUNTIME_EXIT_CODE = flag_parsing.RUNTIME_ERROR_EXIT_CODE


def _parameter_only_options() -> list:
  """The options that give parameters and never an optimizer's (the BLT's theta, ...)."""
  optimizer = {o.name for entry in registry.entries() for o in entry.optimizer_options}
  return sorted(set(registry.option_table()) - optimizer)


def _run_optimize(fv) -> dict:
  require(fv, 'mechanism', 'rounds', 'min_sep')
  forbid(fv, 'optimize', 'mechanism_file', *_parameter_only_options())
  if fv.mechanism not in registry.optimizable():
    raise UsageError(f'--mechanism must be one of {list(registry.optimizable())} for optimize, got '
                     f'{fv.mechanism!r}.')
  entry = registry.entry(fv.mechanism)
  options = plan_flags.mechanism_options(fv)
  if options.get('num_bands') is not None and options['num_bands'] > fv.rounds:
    raise UsageError(f'--num_bands={options["num_bands"]} must not exceed --rounds={fv.rounds}.')
  if fv.output and fv.output.lower().endswith('.npz') != (entry.file_suffix == '.npz'):
    raise UsageError(f'--output for {fv.mechanism} must '
                     + ('end with .npz.' if entry.file_suffix == '.npz' else
                        'be a JSON path (not .npz).'))
  memory.check_fits(fv.mechanism, fv.rounds)
  if fv.output:
    amplified_commands.check_output(fv.output)
  return commands.optimize(fv.mechanism, fv.rounds, plan_flags.participation(fv),
                           output=fv.output, **options)


def _evaluated_strategy(fv) -> base.Strategy:
  """The strategy of --mechanism_file, or of --mechanism and its parameter options."""
  if fv.mechanism_file is None:
    require(fv, 'mechanism')
  return resolve.resolve_strategy(fv.mechanism, strategy=fv.mechanism_file,
                                  options=plan_flags.mechanism_options(fv),
                                  allow_setting_mismatch=True, fallback='error').strategy


def _run_evaluate(fv) -> dict:
  require(fv, 'rounds', 'min_sep')
  forbid(fv, 'evaluate', 'output')
  strategy = _evaluated_strategy(fv)
  if strategy.max_rounds is not None and fv.rounds > strategy.max_rounds:
    raise UsageError(f'--rounds={fv.rounds} exceeds the {strategy.max_rounds} rounds of the '
                     f'{strategy.name} strategy.')
  memory.check_fits(strategy.name, fv.rounds)
  record = commands.evaluate(strategy, fv.rounds, plan_flags.participation(fv))
  if fv.mechanism_file is not None:
    record['mechanism_file'] = fv.mechanism_file
  else:
    record.update(strategy.describe())
  return record


def _usage() -> str:
  return __doc__ + '\nFlags:\n' + _FLAGS.get_help()


def _report_error(error: BaseException, argv: Sequence[str]) -> int:
  """Prints `error: <one line>` on stderr (the traceback first with --debug); returns the status."""
  debug = _FLAGS['debug'].value if _FLAGS.is_parsed() else any(
      arg in ('--debug', '-debug', '--debug=true', '--debug=1') for arg in argv[1:])
  if debug:
    traceback.print_exc()
  runtime = isinstance(error, RuntimeFailure | OSError | MemoryError)
  if isinstance(error, MemoryError):
    message = 'out of memory; use fewer --rounds.'
  elif isinstance(error, flags.Error | ValueError | RuntimeFailure):
    message = str(error)
  else:
    runtime = True
    message = f'{type(error).__name__}: {error} (rerun with --debug for the traceback)'
  print(flag_parsing.error_text(message, _FLAGS, PROGRAM), file=sys.stderr)
  return RUNTIME_EXIT_CODE if runtime else USAGE_EXIT_CODE


def _run(command: str, fv) -> dict:
  if command == 'amplified':
    return amplified_commands.run_amplified(fv)
  if command == 'select_bands':
    return amplified_commands.run_select_bands(fv)
  amplified_commands.forbid_amplification_flags(fv, command)
  return _run_optimize(fv) if command == 'optimize' else _run_evaluate(fv)


def main(argv: Sequence[str]) -> int:
  """Runs the CLI on `argv` (argv[0] is the program name); returns the exit status."""
  argv = list(argv)
  if any(arg in ('-h', '--help', '-help', '--helpfull') for arg in argv[1:]):
    print(_usage())
    return 0
  try:
    _FLAGS.unparse_flags()
    flag_parsing.check_flagfiles(argv)
    positional = _FLAGS(argv)[1:]
    if len(positional) != 1 or positional[0] not in COMMANDS:
      raise UsageError(f'expected one command out of {list(COMMANDS)}, got {positional}.')
    record = _run(positional[0], _FLAGS)
  except Exception as e:  # every error is one line; --debug adds the traceback
    return _report_error(e, argv)
  if _FLAGS.json:
    print(json.dumps(record))
  elif positional[0] == 'select_bands':
    print(amplified_commands.format_selection(record))
  else:
    print(commands.format_table(record))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
