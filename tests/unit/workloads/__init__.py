"""Unit tests of ddpscale.workloads: the built-in models and data modules."""
