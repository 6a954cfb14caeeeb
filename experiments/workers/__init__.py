"""TFF workers: the launcher of local workers (`python -m experiments.workers`), a run's workers and
the retry of a round that lost one, and the `worker_binary` children of this process."""
