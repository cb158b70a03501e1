"""How a run's ranks start and end: the local launcher that forks one process per device, the
lock that lets one experiment at a time train on a machine, where each rank landed (its GPU,
rank 0's port), what every rank reports to the others, and the end of a rank's process."""
