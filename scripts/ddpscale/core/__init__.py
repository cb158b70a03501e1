"""Torch-free definitions every stage shares: the results' layout, a run's record (metrics.json
and its progress line), the statistics of the stopping rule, which network the collectives
crossed, an earlier table to compare with, the spiral data file, file helpers.

Imports nothing from ddpscale outside this package (tests/unit/test_imports.py)."""
