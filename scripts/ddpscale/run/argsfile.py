"""A script's settings in a file: the flags the workflow would have passed, read back by the script.

A job's command line is bounded by the kernel: one argument is at most MAX_ARG_STRLEN (128 KiB
on Linux), and a rule's shell line is one argument of `bash -c`. A config whose settings are
longer (data init arguments listing thousands of files) would fail every job with "Argument
list too long". So where the flags pass INLINE_LIMIT the workflow writes them, as a JSON list, to
a file whose path comes from ddpscale.core.layout, and passes the path and the list's digest; the
script refuses a file whose digest is not the one on its command line (written by another
snakemake, or edited since) and parses the list with its own parser, as if it had come on the
command line. Flags within the limit stay on the command line, where `snakemake -n -p` shows
them and the printed command can be run again by hand.

Torch-free: the workflow imports this module while it parses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

from ddpscale.core.io import read_json_dict, read_regular, write_json_atomic

# far below MAX_ARG_STRLEN, which the launch prefix and the log's flags share with these
INLINE_LIMIT = 32 * 1024
FILE_FLAG = "--args-file"
DIGEST_FLAG = "--args-digest"


def digest(argv: list[str]) -> str:
    """The list's SHA-256, over one canonical JSON text (not the file's formatting)."""
    return hashlib.sha256(json.dumps(argv, separators=(",", ":")).encode()).hexdigest()


def write_file(path: str | os.PathLike, argv: list[str]) -> None:
    """The flags to path, atomically, and only where they changed: Snakemake asks for a job's
    params more than once, and a file rewritten with the same content would be churn."""
    if read_json_dict(path) != {"argv": argv}:
        write_json_atomic(path, {"argv": argv})


def command(path: str | os.PathLike, argv: list[str], write: bool) -> list[str]:
    """What the command line carries: argv itself, or where it passes INLINE_LIMIT, the file
    holding it (written where `write`: by the snakemake that runs the jobs, not a dry run)."""
    if sum(len(arg) + 1 for arg in argv) <= INLINE_LIMIT:
        return list(argv)
    if write:
        write_file(path, argv)
    return flags(path, argv)


def flags(path: str | os.PathLike, argv: list[str]) -> list[str]:
    """What the command line carries instead of argv: the file and the digest of its flags."""
    return [f"{FILE_FLAG}={path}", f"{DIGEST_FLAG}={digest(argv)}"]


def read(path: str | os.PathLike, expected: str) -> list[str]:
    """The flags in path, or ValueError in one line naming the file and the fix."""
    fix = "run the workflow again: it writes the file from the config it runs"
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read this job's settings ({err.strerror or err}); {fix}") from None
    except ValueError as err:  # JSON and UTF-8 errors
        raise ValueError(f"{path}: this job's settings are not valid JSON ({err}); {fix}") from None
    argv = data.get("argv") if isinstance(data, dict) else None
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        raise ValueError(f'{path}: expected {{"argv": [flags as text]}}; {fix}')
    if digest(argv) != expected:
        raise ValueError(f"{path}: these settings have digest {digest(argv)}, but the job was started with "
                         f"{expected}: the file changed after this job was planned (another snakemake in this "
                         f"directory, or an edit); {fix}")
    return argv


def expand(argv: list[str]) -> list[str]:
    """argv with --args-file/--args-digest replaced by the file's flags (first, so a flag given
    on the command line after them, the attempt say, is read as given); unchanged without them."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument(FILE_FLAG, dest="path")
    pre.add_argument(DIGEST_FLAG, dest="digest")
    known, rest = pre.parse_known_args(argv)
    if known.path is None and known.digest is None:
        return list(argv)
    if known.path is None or known.digest is None:
        raise ValueError(f"{FILE_FLAG} and {DIGEST_FLAG} come together: the workflow passes both")
    return [*read(known.path, known.digest), *rest]
