"""Unit tests of ddpscale.report.render: the page, its tables and plots."""
