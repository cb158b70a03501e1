"""Unit tests of ddpscale.report.figures: the computed figures."""
