"""Measurement: epoch timing, FLOPs and MFU, GPU facts, and the probe of a step and all-reduce."""
