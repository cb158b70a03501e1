"""Built-in workloads: seed 004's spiral MLP (overhead-bound) and a GPT-like transformer
(compute-bound), with their data modules. Users name their own in config instead."""
