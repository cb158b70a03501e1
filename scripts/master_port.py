"""Print a port for rank 0 that no other job uses on this node (the first of the allocation,
where the batch step runs); the SLURM launch command exports it as MASTER_PORT to srun."""

import os
import socket
import sys

from ddpscale.job.launch.placement import PlacementError, master_port


def is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":
    if "SLURM_JOB_ID" not in os.environ:
        sys.exit("ddpscale master_port: SLURM_JOB_ID is not set; this runs in the batch step of a SLURM job")
    try:
        print(master_port(os.environ["SLURM_JOB_ID"], is_free))
    except PlacementError as err:
        sys.exit(f"ddpscale master_port: {err}")
