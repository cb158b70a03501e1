"""The one reader of a YAML file of ours: config/config.yaml, a --configfile overlay, a
LightningCLI config (config lightning_config), a profile's config.yaml.

read_yaml returns the parsed data or one line naming the file, the line and the fix, for every
file the workflow, `make status` and the profile checks read. It refuses what a YAML parser
would turn into a traceback or a hang (a FIFO, a device, a directory, bytes that are not UTF-8,
a number with more digits than Python converts, nesting deep enough to exhaust the recursion
limit), what it would read silently wrong (a key given twice in one mapping: YAML keeps the
last), what grows without bound once read (aliases of aliases), and a file Snakemake would run
as code (a yte template). Torch-free and numpy-free: `make status` imports it.
"""

from __future__ import annotations

import os
import stat

import yaml

from ddpscale.core.io import terminal_safe

# A config is a page of settings; a bigger file is a mistake (a data file named as a config)
# and is refused before YAML reads it.
MAX_CONFIG_BYTES = 1 << 20
# YAML aliases (*name) repeat a node without copying it, so a file of a few lines can stand for
# billions of values ("billion laughs"); everything that walks the config after the parse (the
# schema, a run's flags and identity) expands them, and that ended in a MemoryError. A page of
# settings has hundreds.
MAX_CONFIG_VALUES = 100_000
# PyYAML composes nested nodes recursively: a few hundred '[' end in a RecursionError. A
# LightningCLI config nests about 6 deep.
MAX_DEPTH = 50
# Python refuses to convert an integer of more than 4300 digits (a ValueError inside YAML); no
# setting takes more than about 20, and a message quotes the value.
MAX_INT_DIGITS = 100
# Snakemake reads its config files with yte, which evaluates the file as a template (Python
# expressions) when this key is true at its top level.
YTE_KEY = "__use_yte__"


class _Refused(Exception):
    """A problem at a line of the file (0-based), raised from inside the parse."""

    def __init__(self, line: int, text: str):
        super().__init__(text)
        self.line, self.text = line, text


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that bounds nesting and refuses a key given twice in one mapping."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark.line,
                               f"nested more than {MAX_DEPTH} levels deep; a config lists settings: flatten it, or "
                               "load deep data from a file in your module")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        # the keys as written, before any merge (<<: *base) lends keys that these may override
        seen = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            first = seen.get((key.tag, key.value))
            if first is not None:
                lines = (f"twice on line {first + 1}" if first == key.start_mark.line
                         else f"on lines {first + 1} and {key.start_mark.line + 1}")
                raise _Refused(key.start_mark.line, f"key '{terminal_safe(key.value[:60])}' is given {lines} of one "
                               "mapping, and YAML would keep the second silently; keep one")
            seen[(key.tag, key.value)] = key.start_mark.line
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as err:  # a date like 2024-02-30, or a number Python refuses
            raise _Refused(node.start_mark.line, f"YAML cannot read the value `{terminal_safe(str(node.value)[:40])}` "
                           f"({str(err)[:80]}); quote it if it is text, or fix the value") from None


def _construct_int(loader, node):
    digits = sum(c.isdigit() for c in node.value)
    if digits > MAX_INT_DIGITS:
        raise _Refused(node.start_mark.line, f"a whole number of {digits:,} digits, more than any setting takes "
                       f"({MAX_INT_DIGITS}); fix the value")
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def read_bytes(path, where: str) -> tuple[bytes | None, str | None]:
    """(bytes, None) of a regular file up to MAX_CONFIG_BYTES, or (None, why not).

    Opened without blocking and checked with fstat before reading: a FIFO would wait for a
    writer forever, a device may never end, and a path checked before opening may change."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, f"{where}: no such file (paths are relative to the directory snakemake runs in); fix the path"
    except OSError as err:
        return None, f"{where}: cannot be opened ({err.strerror}); fix the path or its permissions"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a FIFO, socket or device)"
            return None, f"{where}: is {kind}, not a config file; name the YAML file itself"
        if info.st_size > MAX_CONFIG_BYTES:
            return None, (f"{where}: {info.st_size:,} bytes, more than a config's {MAX_CONFIG_BYTES:,}; is it the "
                          "right file?")
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        return None, f"{where}: cannot be read ({err.strerror}); fix the file or its permissions"
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CONFIG_BYTES:  # grew since fstat
        return None, f"{where}: more than a config's {MAX_CONFIG_BYTES:,} bytes; is it the right file?"
    return data, None


def decoded(data: bytes, where: str) -> tuple[str | None, str | None]:
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        return None, (f"{where} line {line}: byte 0x{data[err.start]:02x} is not UTF-8 text; save the file as "
                      "UTF-8 (or retype that line)")


def expanded_values(tree, limit: int = MAX_CONFIG_VALUES) -> int:
    """How many values a parsed config holds with every alias expanded, counted up to just past
    limit (so a bomb, or an alias that contains itself, costs limit steps at most)."""
    count, stack = 0, [tree]
    while stack and count <= limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return count


def parse_yaml(text: str, where: str) -> tuple[object, str | None]:
    """(data, None) of YAML text, or (None, why not) in one line with its line number and the fix.

    Snakemake's own message for every such file is "Config file is not valid JSON or YAML",
    without a line, and a value Python refuses ends in its traceback."""
    lines = text.splitlines()
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a yaml.SafeLoader
    except _Refused as refused:
        return None, f"{where} line {refused.line + 1}: {refused.text}"
    except RecursionError:  # bounded by MAX_DEPTH; kept so that no input ends in a traceback
        return None, f"{where}: nested too deep for YAML to read; flatten it"
    except yaml.MarkedYAMLError as error:
        return None, _syntax_message(error, lines, where)
    except yaml.YAMLError as error:
        return None, f"{where}: YAML cannot read it ({error}); fix the file's syntax"
    if expanded_values(data) > MAX_CONFIG_VALUES:
        return None, (f"{where}: more than {MAX_CONFIG_VALUES:,} values once its aliases (*name) are expanded; a "
                      "config lists settings: write each value out, or load big data from a file in your module")
    if isinstance(data, dict) and YTE_KEY in data:
        return None, (f"{where}: '{YTE_KEY}' at its top level would make Snakemake evaluate the file as a yte "
                      "template, i.e. run the Python in it; ddpscale's configs are plain YAML: remove the key")
    return data, None


def read_yaml(path, where: str | None = None) -> tuple[object, str | None]:
    """(data, None) of a YAML file of ours, or (None, one line naming the file, the line and the fix)."""
    where = where or str(path)
    data, problem = read_bytes(path, where)
    if problem:
        return None, problem
    text, problem = decoded(data, where)
    if problem:
        return None, problem
    return parse_yaml(text, where)


def _syntax_message(error: yaml.MarkedYAMLError, lines: list[str], where: str) -> str:
    problem, context = error.problem or "", error.context or ""
    mark = error.problem_mark or error.context_mark
    if context.startswith(("while parsing a flow", "while scanning a quoted")) and error.context_mark:
        mark = error.context_mark  # where the bracket or quote was opened
    at = f"{where} line {mark.line + 1}" if mark else where
    shown_line = terminal_safe(lines[mark.line].strip()[:80]) if mark and mark.line < len(lines) else ""
    if "'\\t'" in problem:
        return f"{at}: a tab indents this line, and YAML indents with spaces only: replace the tab with spaces"
    if context.startswith("while parsing a flow sequence"):
        return f"{at}: the list opened with '[' on this line is not closed: close it with ']' (`{shown_line}`)"
    if context.startswith("while parsing a flow mapping"):
        return f"{at}: the mapping opened with '{{' on this line is not closed: close it with '}}' (`{shown_line}`)"
    if context.startswith("while scanning a quoted"):
        return f"{at}: the quote opened on this line is not closed: end the text with the same quote (`{shown_line}`)"
    if problem.startswith("mapping values are not allowed"):
        return (f"{at}: a second ':' on one line (`{shown_line}`): quote a value that contains ': ', "
                "or put a nested key on its own line, indented")
    if "expected <block end>" in problem:
        return (f"{at}: this line is indented as no key above it is (`{shown_line}`): indent it exactly as "
                "far as the keys it belongs with")
    return f"{at}: YAML cannot read it ({problem or context}): fix that line (`{shown_line}`)"
