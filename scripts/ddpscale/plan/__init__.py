"""What the workflow imports while it parses, torch-free: config checks, the facts of the user's
modules, site facts to SLURM resources, the plan of runs and each run's spec built from it, the
plan's cost, the squeue query that guards against a second job of one run.

Imports only ddpscale.core and ddpscale.run (tests/unit/test_imports.py): a dry run must not
import torch."""
