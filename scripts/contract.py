"""Import the configured model and data classes once and print, as JSON, what the workflow's
contract check needs of them (ddpscale.plan.contract): whether each module imports, which
classes it holds, each class's base and the arguments its __init__ takes, and the sha256 of
the module files they came from (the workflow caches the facts while those stay the same).

The workflow runs it while it is parsed, in a process of its own, so a dry run imports no
torch unless the user's code changed.
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
    p.add_argument("--root", default=".", help="the workflow's working directory, where train.py imports from")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.root))  # as train.py finds user code (plugins.load_class)
    import pytorch_lightning as pl

    from ddpscale.plan.plugins import class_facts, loaded_files

    facts = {"model": class_facts(args.model_class, pl.LightningModule, args.root),
             "data": class_facts(args.data_class, pl.LightningDataModule, args.root)}
    packages = {args.model_class.split(".")[0], args.data_class.split(".")[0]}
    facts["files"] = loaded_files(args.root, packages)
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
