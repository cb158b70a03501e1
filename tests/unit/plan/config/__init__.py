"""Unit tests of ddpscale.plan.config: the config as the user wrote it, read and checked."""
