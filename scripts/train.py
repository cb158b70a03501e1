"""Train one topology with Lightning DDP and write its metrics.json (rank 0, atomically, last).

Every rank runs this script; the launcher (scripts/launch_local.py or srun) starts them. The
settings come as flags, or in an args file the workflow wrote (ddpscale.run.runspec); the
topology is checked against the process group that formed. The run itself (build, fit, test
pass, record) is ddpscale.job.build.train; here an error the user can mend ends each rank in
one line.
"""

import signal
import sys

from pytorch_lightning.utilities.exceptions import SIGTERMException

from ddpscale.job.build import train
from ddpscale.job.device.compiling import overwritten_output_line
from ddpscale.job.device.gpu import CudaUnavailable
from ddpscale.job.launch.ranks import close_process_group
from ddpscale.job.measure.samplecount import BatchSizeError
from ddpscale.job.measure.timing import NonFiniteLossError, WorldSizeError
from ddpscale.job.resume.signals import StopRequested, exit_code, stop_message
from ddpscale.run import ddpsettings, runspec, usermodule

# what the user can mend, each said in one line: the settings, the module, the data, the device
MENDABLE = (usermodule.PluginError, CudaUnavailable, NonFiniteLossError, WorldSizeError, BatchSizeError,
            ddpsettings.SettingError, FileNotFoundError, ValueError)


def main(argv=None) -> int:
    return train(runspec.parse(argv))


def say(line: str) -> None:
    """One line to stderr in one write: print writes the text and its newline apart, and the
    ranks of a failing run write at once, so two ranks' lines ran together on one line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    try:
        code = main()
        close_process_group()
        sys.exit(code)
    except StopRequested as stopped:
        say(f"ddpscale train: {stopped}")
        sys.exit(exit_code(stopped.signum))
    except SIGTERMException:  # Lightning's own handler, outside training (e.g. in trainer.test)
        say(f"ddpscale train: {stop_message(signal.SIGTERM, None)}")
        sys.exit(exit_code(signal.SIGTERM))
    except MENDABLE as err:
        say(f"ddpscale train: {err}")
        sys.exit(3)
    except RuntimeError as err:
        line = overwritten_output_line(err)
        if line is None:
            raise
        say(f"ddpscale train: {line}")
        sys.exit(3)
