"""Cluster: topologies, a profile's site facts -> SLURM resources, launching ranks, placement.

Light on purpose (no torch): the workflow imports topology, resources and hostdevices while
it parses, and a dry run must stay fast.
"""
