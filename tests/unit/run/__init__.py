"""Unit tests of ddpscale.run: the run's shared vocabulary (spec, identity, topology, DDP settings, the user's modules)."""
