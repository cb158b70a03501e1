"""Unit tests of ddpscale.job.device: GPU facts, FLOPs, compile, transport."""
