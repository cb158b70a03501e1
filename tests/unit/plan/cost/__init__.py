"""Unit tests of ddpscale.plan.cost: what the runs cost before they are submitted."""
