"""A task that is neither EMNIST nor StackOverflow, written as a user would write their own: a
two-layer MLP on 20 float features and 5 classes (`task`), for `experiments.run_task` and
docs/training.md."""
