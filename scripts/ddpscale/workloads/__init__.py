"""Built-in workloads: the MPCDF Raven tutorial's spiral MLP (overhead-bound) and a GPT-like transformer
(compute-bound), with their data modules. Users name their own in config instead."""
