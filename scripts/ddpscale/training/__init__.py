"""Training: the user's modules, run flags, checkpoints, signals and the run's record."""
