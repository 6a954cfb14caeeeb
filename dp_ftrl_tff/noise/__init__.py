"""Streaming correlated-noise states in TensorFlow: gaussian, tree, banded, BLT (one module each)."""
