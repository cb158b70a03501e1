"""Unit tests of ddpscale.report.load: records read and described."""
