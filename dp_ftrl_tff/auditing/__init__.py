"""Empirical privacy estimation from canary statistics (numpy / scipy; no TensorFlow): a run inserts
canary clients with random directions and records their projections on every release (`records`);
`statistics` scores them per threat model (final model, all iterates, all iterates whitened with the
mechanism's noise correlation); `estimates` turns two score samples into a one-shot epsilon estimate
and a lower bound with confidence; `empirical` gives one such row per threat model of a run.
Importing this package never imports TensorFlow (a test checks it).
"""

from dp_ftrl_tff.auditing.empirical import EmpiricalRow, canary_participation, empirical_privacy
from dp_ftrl_tff.auditing.estimates import MIN_SEEN_CANARIES, epsilon_lower_bound, estimate_epsilon
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
)

__all__ = [
    'CANARY_FILE', 'MIN_SEEN_CANARIES', 'PROJECTIONS_FILE', 'RUN_ID_PATTERN', 'THREAT_MODELS',
    'THREAT_MODEL_TEXT', 'CanaryFilesWriter', 'CanaryRecord', 'EmpiricalRow', 'canary_participation',
    'canary_statistics', 'check_run_id',
    'empirical_privacy', 'epsilon_lower_bound', 'estimate_epsilon', 'plan_noise_matrix',
    'plan_digest', 'read_canaries',
]
