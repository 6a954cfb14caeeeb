"""Empirical privacy estimation from canary statistics (numpy / scipy; no TensorFlow): a run inserts
canary clients with random directions and records their projections on every release (`records`);
`statistics` scores them per threat model (final model, all iterates, all iterates whitened with the
mechanism's noise correlation); `estimates` turns two score samples into a one-shot epsilon estimate;
`empirical` gives one row per threat model of a run: the estimate, every lower bound below with a
confidence that holds for all of them together, and the attack's figures.
The lower bounds of the literature, each an `EpsilonBound` with its confidence and threshold choice:
`threshold_bounds` (Clopper-Pearson, Gaussian-DP fit), `one_run` (Steinke et al.), `one_run_fdp`
(Mahloujifar et al.); `gdp` holds Gaussian DP's closed forms and `attack_metrics` the attack's
TPR at FPR, AUROC and accuracy; `per_round` feeds the likelihood-ratio statistic of a canary's
per-round scores to those bounds.
Importing this package never imports TensorFlow (a test checks it).
"""

from dp_ftrl_tff.auditing.attack_metrics import attack_auroc, max_accuracy, tpr_at_fpr
from dp_ftrl_tff.auditing.bound import EpsilonBound
from dp_ftrl_tff.auditing.empirical import (
    METHODS,
    EmpiricalRow,
    best_bound,
    canary_participation,
    empirical_privacy,
)
from dp_ftrl_tff.auditing.estimates import MIN_SEEN_CANARIES, estimate_epsilon
from dp_ftrl_tff.auditing.one_run import one_run_bound
from dp_ftrl_tff.auditing.one_run_fdp import one_run_fdp_bound
from dp_ftrl_tff.auditing.per_round import per_round_bound
from dp_ftrl_tff.auditing.records import (
    CANARY_FILE,
    PROJECTIONS_FILE,
    RUN_ID_PATTERN,
    CanaryFilesWriter,
    CanaryRecord,
    check_run_id,
    plan_digest,
    read_canaries,
)
from dp_ftrl_tff.auditing.statistics import (
    THREAT_MODEL_TEXT,
    THREAT_MODELS,
    canary_statistics,
    plan_noise_matrix,
    whitened_rounds,
)
from dp_ftrl_tff.auditing.threshold_bounds import clopper_pearson_bound, gdp_fit_bound

__all__ = [
    'CANARY_FILE', 'METHODS', 'MIN_SEEN_CANARIES', 'PROJECTIONS_FILE', 'RUN_ID_PATTERN',
    'THREAT_MODELS', 'THREAT_MODEL_TEXT', 'CanaryFilesWriter', 'CanaryRecord', 'EmpiricalRow',
    'EpsilonBound', 'attack_auroc', 'best_bound', 'canary_participation', 'canary_statistics',
    'check_run_id', 'clopper_pearson_bound', 'empirical_privacy', 'estimate_epsilon',
    'gdp_fit_bound', 'max_accuracy', 'one_run_bound', 'one_run_fdp_bound', 'per_round_bound',
    'plan_digest', 'plan_noise_matrix', 'read_canaries', 'tpr_at_fpr', 'whitened_rounds',
]
