"""Correlated-noise mechanisms in numpy/scipy (no TensorFlow): participation schemas, sensitivity,
Toeplitz helpers, Gaussian / tree / banded / BLT strategies, losses and optimizers."""

from dp_ftrl_tff.mechanisms.base import Losses, OptimizationResult, Strategy, prefix_sum_workload
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema

__all__ = ['Losses', 'OptimizationResult', 'ParticipationSchema', 'Strategy',
           'prefix_sum_workload']
