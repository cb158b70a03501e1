"""Unit tests of ddpscale.job.launch: the local launcher, ranks, placement and the machine lock."""
