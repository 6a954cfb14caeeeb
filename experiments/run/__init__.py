"""The run machinery of the simulation drivers: settings, flags, setup, run directory, console,
the training loop, stop signals and the completion record."""
