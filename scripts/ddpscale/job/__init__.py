"""What runs inside a training job, by concept: the run built from its spec (build) with every
callback in one place (callbacks) and its bookkeeping (runinfo); how its ranks start, land and
end (launch); what it measures (measure); the probe before its first epoch (probe); the device
it trains on (device); and how it stops and resumes (resume).

Imports ddpscale.core and ddpscale.run, never the plan, the report or the status command."""
