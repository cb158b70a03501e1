"""Import the configured model and data classes (and a LightningCLI config's optimizer and
lr_scheduler) once and write, as JSON to the file --out names, what the workflow's contract check
needs of them (ddpscale.run.usermodule): whether each module imports, which classes it holds, each
class's base and the arguments its __init__ takes, and the sha256 of the module files they came
from (the workflow caches the facts while those stay the same).

The workflow runs it while it is parsed, in a process of its own, so a dry run imports no
torch unless the user's code changed. What the user's modules print while they import goes to
stderr: the facts travel in their own file, which no print can corrupt.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ddpscale, when run from anywhere


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-class", required=True)
    p.add_argument("--data-class", required=True)
    p.add_argument("--optimizer", help="a LightningCLI config's optimizer, as an import path")
    p.add_argument("--lr-scheduler", help="a LightningCLI config's lr_scheduler, as an import path")
    p.add_argument("--root", default=".", help="the workflow's working directory, where train.py imports from")
    p.add_argument("--out", required=True, help="the file the facts are written to, as JSON")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # fd 1 (Python's print and a C library's printf alike) becomes stderr
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.path.insert(0, os.path.abspath(args.root))  # as train.py finds user code (usermodule.load_class)
    import pytorch_lightning as pl
    import torch
    from ddpscale.run.usermodule import class_facts, loaded_files

    facts = {"model": class_facts(args.model_class, pl.LightningModule, args.root),
             "data": class_facts(args.data_class, pl.LightningDataModule, args.root)}
    # the kinds LightningCLI takes (ddpscale.run.lightningcli.CLASS_BASES)
    kinds = {"optimizer": (args.optimizer, (torch.optim.Optimizer,)),
             "lr_scheduler": (args.lr_scheduler, (torch.optim.lr_scheduler.LRScheduler,
                                                  torch.optim.lr_scheduler.ReduceLROnPlateau))}
    for key, (class_path, bases) in kinds.items():
        if class_path:
            facts[key] = class_facts(class_path, bases, args.root)
    packages = {path.split(".")[0] for path in (args.model_class, args.data_class, args.optimizer, args.lr_scheduler)
                if path}
    facts["files"] = loaded_files(args.root, packages)
    Path(args.out).write_text(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
