"""Unit tests of ddpscale.plan: what the workflow computes while it parses."""
