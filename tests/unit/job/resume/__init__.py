"""Unit tests of ddpscale.job.resume: checkpoints, their checksums and signals."""
