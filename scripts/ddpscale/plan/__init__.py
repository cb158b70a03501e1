"""What the workflow imports while it parses, torch-free: config checks, the contract check of
the user's modules, site facts to SLURM resources, the plan's cost, the spiral dataset, the
squeue query that guards against a second job of one run.

Imports only ddpscale.core (tests/unit/test_imports.py): a dry run must not import torch."""
