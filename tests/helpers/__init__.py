"""What more than one test file uses, one module per concept: made-up records and the report
made from them, the workflow in a throwaway copy and its profiles, configs and the plan built
from one, training runs, GPUs, the probe in this process, `make status`, the SLURM test cluster,
a headless browser and the system tools the tests install."""
