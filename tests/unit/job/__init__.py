"""Unit tests of ddpscale.job: what runs inside a training job."""
