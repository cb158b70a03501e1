"""`make status`: queued, running, done or failed per planned run, from the files and squeue.

Imports ddpscale.core, ddpscale.run and ddpscale.plan only: it runs on a login node in a fraction of a second."""
