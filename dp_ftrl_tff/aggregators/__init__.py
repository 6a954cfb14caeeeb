"""TFF aggregation factories: DP mean with correlated streaming noise (DP-FTRL), clipping, SecAgg."""

from dp_ftrl_tff.aggregators.adaptive_clipping import (
    EVERY_ROUND,
    GBOARD_RESTARTS,
    AdaptiveClipping,
    RestartSchedule,
)
from dp_ftrl_tff.aggregators.correlated_noise import (
    MEASUREMENT_KEYS,
    CorrelatedNoiseFactory,
    CorrelatedNoiseState,
    DPState,
)
from dp_ftrl_tff.aggregators.secure import SecureAggregation

__all__ = [
    'AdaptiveClipping', 'CorrelatedNoiseFactory', 'CorrelatedNoiseState', 'DPState', 'EVERY_ROUND',
    'GBOARD_RESTARTS', 'MEASUREMENT_KEYS', 'RestartSchedule', 'SecureAggregation',
]
