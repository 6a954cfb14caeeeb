"""Correlated-noise mechanisms in numpy/scipy (no TensorFlow): participation schemas, sensitivity,
Toeplitz helpers, Gaussian / tree / banded / BLT / BSR / BISR strategies, losses, optimizers and
strategy files."""

from dp_ftrl_tff.mechanisms.banded import BandedStrategy
from dp_ftrl_tff.mechanisms.banded_optimizer import optimize_banded
from dp_ftrl_tff.mechanisms.base import (
    Losses,
    OptimizationResult,
    Strategy,
    momentum_workload,
    prefix_sum_workload,
)
from dp_ftrl_tff.mechanisms.blt import BLTStrategy, optimize_blt
from dp_ftrl_tff.mechanisms.files import load_strategy, save_strategy
from dp_ftrl_tff.mechanisms.gaussian import GaussianStrategy
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from dp_ftrl_tff.mechanisms.square_root import (
    BandedInverseSquareRootStrategy,
    BandedSquareRootStrategy,
)
from dp_ftrl_tff.mechanisms.tree import TreeStrategy

__all__ = ['BLTStrategy', 'BandedInverseSquareRootStrategy', 'BandedSquareRootStrategy',
           'BandedStrategy', 'GaussianStrategy', 'Losses', 'OptimizationResult', 'ParticipationSchema',
           'Strategy', 'TreeStrategy', 'load_strategy', 'momentum_workload', 'optimize_banded',
           'optimize_blt', 'prefix_sum_workload', 'save_strategy']
