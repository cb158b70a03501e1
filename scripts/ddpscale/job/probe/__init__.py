"""The probe a run makes before its first epoch, on a copy of the run's module: where one step's
time goes (data wait, compute, exposed gradient sync), the compute at other per-device batches,
the all-reduce bandwidth, and the record of what it measured."""
