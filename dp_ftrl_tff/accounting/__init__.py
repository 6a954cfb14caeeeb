"""Privacy accounting without TensorFlow: rho-zCDP and (epsilon, delta) of correlated-noise mechanisms.

Modules:
  * `zcdp`: a run's `Guarantee`: rho = sens^2 / (2 sigma^2) from a `mechanisms` strategy, and its
    (epsilon, delta) by `zcdp_epsilon`.
  * `zcdp_epsilon`: (epsilon, delta) of rho-zCDP through dp_accounting's PLD accountant on one
    Gaussian event with noise multiplier 1 / sqrt(2 rho); above rho 100 (the PLD's memory) the zCDP
    conversion bound, flagged as an upper bound; the exact Gaussian and RDP conversions.
  * `calibration`: the noise multiplier that meets a target rho or a target (epsilon, delta).
  * `participation_log`: the `client_id,round` participation log: its format, writer and reader;
    realized min_sep and max participations.
  * `report`: the privacy report's data and composition (`PrivacyReport`, `build_report`), of the
    section builders `report_participation`, `report_sections` and `report_empirical`, each
    returning its data and its typed findings (`report_parts.Finding`).
  * `report_files`: `report_from_run_files`, the report of a run from its plan, participation log,
    metrics CSV and canary record (the one builder of the drivers, the report release and
    `experiments.privacy_report`).
  * `run_metrics`: what the report reads of a run's metrics CSV (SecAgg segments and wrapped
    rounds, adaptive clipping's final clip).
  * `report_render`: the report as JSON, terminal summary, markdown checklist and plots.
  * `run_guarantee`: `plan_guarantee`, the guarantee of a `RunPlan` with a composable DpEvent.
  * `equal_privacy`: every mechanism's noise multiplier and losses at the run's privacy.
  * `amplification`: amplified (epsilon, delta) of a banded strategy under cyclic Poisson sampling.
  * `amplified_strategy`: a strategy's bands and largest column norm, and its `AmplifiedGuarantee`.
  * `band_selection`: the number of bands minimizing the amplified error.
  * `monte_carlo`: `monte_carlo_epsilon`, Monte Carlo epsilon with confidence under random
    participation (cyclic Poisson, b-min-sep Poisson-like, balls-in-bins).

The run plan it reads (`dp_ftrl_tff.plan`) holds the adaptive-clipping noise split (Gboard Thm. 1).
Importing this package never imports TensorFlow (a test checks it).
"""

from dp_ftrl_tff.accounting.amplification import (  # noqa: E402,F401
    amplified_epsilon,
    amplified_event,
    amplified_noise_multiplier,
)
from dp_ftrl_tff.accounting.amplified_strategy import (  # noqa: E402,F401
    AmplifiedGuarantee,
    amplified_guarantee,
)
from dp_ftrl_tff.accounting.band_selection import (  # noqa: E402,F401
    BandCandidate,
    BandSelection,
    BandSelector,
    select_bands,
)
from dp_ftrl_tff.accounting.monte_carlo import (  # noqa: E402,F401
    MonteCarloEpsilon,
    monte_carlo_epsilon,
)
from dp_ftrl_tff.accounting.run_guarantee import RunGuarantee, plan_guarantee  # noqa: E402,F401
