"""Unit tests of ddpscale.job.measure: timing, windows, sample counts and the accuracy history."""
