"""Unit tests of ddpscale.job.probe: the probe inside a run."""
