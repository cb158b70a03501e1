"""Torch-free definitions every stage shares: the results' layout, topologies, what a run
measures, the statistics of its stopping rule and its progress line, file helpers.

Imports nothing from ddpscale outside this package (tests/unit/test_imports.py)."""
