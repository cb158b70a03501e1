"""What a training run measures while it trains: its epochs' times and the time it held its
devices, throughput mode's windows and when they stop, every sample counted once, and the
accuracy metric's history."""
