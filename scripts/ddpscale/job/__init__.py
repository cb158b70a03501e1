"""What runs inside a training job, by concept: the run built from its spec (build) with every
callback in one place (callbacks), its identity and its record, assembled from the sections
each concept writes (record); how its ranks start, land and end (launch); what it measures (measure); the probe before its first epoch (probe); the device
it trains on (device); and how it stops and resumes (resume).

Imports ddpscale.core and ddpscale.run, never the plan, the report or the status command."""
