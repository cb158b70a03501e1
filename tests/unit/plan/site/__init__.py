"""Unit tests of ddpscale.plan.site: what a profile says of the site."""
