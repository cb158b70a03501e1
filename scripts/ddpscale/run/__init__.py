"""The run's shared vocabulary, torch-free: what one training run is (its settings, the RunSpec,
and their file form), what its numbers depend on (its identity), the world it runs on (its
topology, and what this host offers a local run), what it measures, its DDP settings, a
LightningCLI config read as its settings, and the user's modules with the contract they keep.
The workflow builds runs from it while it parses (ddpscale.plan) and the job reads them back
(ddpscale.job), so both speak it and neither imports the other.

Imports only ddpscale.core (tests/unit/test_imports.py)."""
