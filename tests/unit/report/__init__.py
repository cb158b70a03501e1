"""Unit tests of ddpscale.report: records in, scaling table, verdict, figures and report.html out."""
