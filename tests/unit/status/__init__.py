"""Unit tests of ddpscale.status: make status."""
