"""plan.json: what the workflow planned for one experiment, for `make status`.

The workflow writes it when its jobs start (RunPlan.record, common.smk's write_plan), from the
config as that run merged it (config/config.yaml, every --configfile and --config) and the site it
resolved: the experiment, its measure mode, the baseline and each stage's topologies and repeats.
`make status` reads it back, since it sees neither the run's command line nor its site.

Versioned: a file of another version or shape is as good as none (the next run rewrites it).
The reader takes the file as hostile, because anything may lie in a results folder: a FIFO, a
directory, a symbolic link (the workflow writes a file, never a link), a huge file, bytes that
are not UTF-8 or JSON nested past the recursion limit each come back as one line, never a hang
or a traceback; the writer never raises (write). Torch-free and pure but for read() and write().
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass

from ddpscale.run import measuremode
from ddpscale.core.io import file_kind, terminal_safe, write_json_atomic
from ddpscale.core.layout import NAME_PATTERN, TOPOLOGY_FOLDER
from ddpscale.run.topology import STAGES, parse_topology, stage_of

VERSION = 1
# A plan lists a few topologies; a bigger file is not the workflow's and is not read.
MAX_BYTES = 1 << 20
# The longest topology name read back ("1000x1000" is nine characters); a longer one is not the
# workflow's, and a name of thousands of digits would not convert to a number.
MAX_NAME = 20


@dataclass(frozen=True)
class Stage:
    topologies: tuple[str, ...]  # in the order the workflow sorts them
    repeats: int


@dataclass(frozen=True)
class Planned:
    """One experiment's plan as its workflow wrote it."""

    experiment: str
    measure: str  # throughput or full, as resolved on the run's site
    baseline: str
    stages: dict[str, Stage]  # every stage of core/topology.STAGES, in that order

    def record(self) -> dict:
        """plan.json's content."""
        return {"version": VERSION, "experiment": self.experiment, "measure": self.measure,
                "baseline": self.baseline,
                "stages": {name: {"topologies": list(stage.topologies), "repeats": stage.repeats}
                           for name, stage in self.stages.items()}}

    def runs(self) -> list[tuple[str, int]]:
        """(topology, repeat) of every planned run, topologies in core/topology's order."""
        repeats = {t: stage.repeats for stage in self.stages.values() for t in stage.topologies}
        return [(t, r) for t in sorted(repeats, key=parse_topology) for r in range(repeats[t])]

    def summary(self) -> str:
        """measure full, 3 topologies, 1 repeat each."""
        counts = sorted({stage.repeats for stage in self.stages.values() if stage.topologies})
        topologies = sum(len(stage.topologies) for stage in self.stages.values())
        each = "/".join(map(str, counts))
        return (f"measure {self.measure}, {topologies} topolog{'y' if topologies == 1 else 'ies'}, "
                f"{each} repeat{'' if counts == [1] else 's'} each")


def written(experiment: str, measure: str, baseline: str, stage_topologies: dict[str, list[str]],
            repeats: int) -> dict:
    """What the workflow writes: stage_topologies as RunPlan.stage_topologies has them, every
    stage with the same repeats."""
    stages = {name: Stage(tuple(stage_topologies.get(name, ())), repeats) for name in STAGES}
    return Planned(experiment, measure, baseline, stages).record()


def read(path) -> tuple[dict | None, str | None]:
    """(the JSON object, None); (None, None) where there is no file; (None, why) in words that
    follow the file's name, one line, for a file the workflow did not write."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot be read ({err.strerror or err})"
    if stat.S_ISLNK(mode):
        return None, "is a symbolic link, which the workflow never writes"
    try:
        # without blocking (a FIFO would wait for a writer for ever) and never through a link
        # put in its place since the check above
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        return None, f"cannot be read ({err.strerror or err})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, f"is {file_kind(info.st_mode)}, not a regular file"
        if info.st_size > MAX_BYTES:
            return None, f"holds {info.st_size} bytes, more than a plan's {MAX_BYTES}"
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as err:
        return None, f"cannot be read ({err.strerror or err})"
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        return None, f"holds more than a plan's {MAX_BYTES} bytes"
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        return None, f"is not UTF-8 text (byte {err.start})"
    except RecursionError:
        return None, "is JSON nested too deep to read"
    except ValueError as err:
        return None, f"is not valid JSON ({terminal_safe(str(err).splitlines()[0])[:120]})"
    if not isinstance(data, dict):
        return None, "is not a JSON object"
    return data, None


def write(path, content: dict) -> str | None:
    """Write plan.json when it does not already hold `content`; None when it holds it after, else
    why not, one line. Never raises: a plan that cannot be written costs `make status` its rows
    (it says so and falls back to the config), never the run that is starting. Whatever lies in
    its place that is not a regular file (a directory, a FIFO, a link) is replaced only where
    that is one rename: a directory is left alone and named."""
    data, _ = read(path)
    if data == content:
        return None
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return f"{path} is a directory, not the plan: move it away, and the next run writes the plan"
    except OSError:
        pass  # nothing there, or a path that cannot hold it: the write below says which
    try:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        write_json_atomic(path, content)
    except OSError as err:
        return f"{path} cannot be written ({err.strerror or err})"
    return None


def parse(data: dict, experiment: str | None = None) -> tuple[Planned | None, str | None]:
    """(the plan, None), or (None, why) for an object the workflow would not write; experiment:
    the one it must be the plan of (None: any)."""
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        found = "has no version (an earlier ddpscale's)" if "version" not in data else \
            f"is of version {terminal_safe(repr(version))[:40]}, not {VERSION}"
        return None, found
    planned = _planned(data)
    if planned is None or planned.record() != data:
        return None, "is not of the shape the workflow writes"
    if experiment is not None and planned.experiment != experiment:
        return None, f"is the plan of experiment {planned.experiment}, not of {experiment}"
    return planned, None


def _name(value) -> str | None:
    """A topology name as the workflow writes it, else None."""
    if not isinstance(value, str) or len(value) > MAX_NAME or not TOPOLOGY_FOLDER.fullmatch(value):
        return None
    try:
        return value if parse_topology(value).name == value else None
    except ValueError:
        return None


def _planned(data: dict) -> Planned | None:
    experiment, measure, baseline = data.get("experiment"), data.get("measure"), _name(data.get("baseline"))
    stages = data.get("stages")
    if not (isinstance(experiment, str) and re.match(NAME_PATTERN, experiment)) or baseline is None \
            or measure not in (measuremode.THROUGHPUT, measuremode.FULL) \
            or not isinstance(stages, dict) or set(stages) != set(STAGES):
        return None
    found, seen = {}, set()
    for name in STAGES:  # in their order, whatever the file's (written with its keys sorted)
        stage = stages[name]
        if not isinstance(stage, dict) or not isinstance(stage.get("topologies"), list) \
                or not measuremode.valid_repeats(stage.get("repeats")):
            return None
        names = [_name(t) for t in stage["topologies"]]
        if None in names or seen & set(names) or len(set(names)) != len(names) \
                or any(stage_of(parse_topology(t), baseline) != name for t in names):
            return None
        seen.update(names)
        found[name] = Stage(tuple(names), stage["repeats"])
    if list(found["baseline"].topologies) != [baseline]:
        return None
    return Planned(experiment, measure, baseline, found)
