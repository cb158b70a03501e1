"""Start the ranks of one topology on this host (the local profile's launcher; SLURM uses srun)."""

import sys

from ddpscale.job.launch.spawner import main

if __name__ == "__main__":
    sys.exit(main())
