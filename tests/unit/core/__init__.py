"""Unit tests of ddpscale.core: the torch-free helpers, the run record, the stopping rule's statistics."""
