"""TFF aggregation factories: DP mean with correlated streaming noise (DP-FTRL), clipping, SecAgg.

The settings objects a factory is built from live in `dp_ftrl_tff.settings` and are exported here
too.
"""

from dp_ftrl_tff.aggregators.correlated_noise import CorrelatedNoiseFactory
from dp_ftrl_tff.aggregators.process import MEASUREMENT_KEYS, CorrelatedNoiseState
from dp_ftrl_tff.aggregators.secure_process import SecureAggregationState
from dp_ftrl_tff.plan import RunPlan
from dp_ftrl_tff.settings import (
    EVERY_ROUND,
    GBOARD_RESTARTS,
    AdaptiveClipping,
    RestartSchedule,
    SecureAggregation,
)

__all__ = [
    'AdaptiveClipping', 'CorrelatedNoiseFactory', 'CorrelatedNoiseState', 'EVERY_ROUND',
    'GBOARD_RESTARTS', 'MEASUREMENT_KEYS', 'RestartSchedule', 'RunPlan', 'SecureAggregation',
    'SecureAggregationState',
]
