"""Unit tests of ddpscale.report.verdict: the answer and its caveats."""
