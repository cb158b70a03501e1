"""What runs inside a training job: the launcher, the Trainer and its callbacks, timing,
sample counts, FLOPs, the probe, checkpoints and signals, and the run's record.

Imports ddpscale.core and ddpscale.run, never the plan, the report or the status command."""
