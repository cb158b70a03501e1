"""ddpscale.plan.config.read: the one reader of a YAML file of ours returns the data or one line
naming the file, the line and the fix, for whatever the file holds."""

from __future__ import annotations

import os
import threading

import pytest
from helpers.workflow import ROOT
from ddpscale.plan.config.read import MAX_CONFIG_BYTES, MAX_DEPTH, parse_yaml, read_yaml


def problem_of(text: str, where: str = "config/config.yaml") -> str | None:
    return parse_yaml(text, where)[1]


@pytest.mark.parametrize("text,line,words", [
    ("repeats: 1\nbatch:\n\tsize: 64\n", 3, "a tab indents this line"),
    ('topologies: ["1x1", "1x2"\nmax_epochs: 3\n', 1, "the list opened with '[' on this line is not closed"),
    ("batch: {size: 64\nrepeats: 1\n", 1, "the mapping opened with '{' on this line is not closed"),
    ("model:\n  class_path: 'ddpscale.workloads.models.SpiralMLP\nrepeats: 1\n", 2,
     "the quote opened on this line is not closed"),
    ("report: compare_with: old.tsv\n", 1, "a second ':' on one line"),
    ("model:\n  class_path: x\n init_args: {}\n", 3, "this line is indented as no key above it is"),
    ("repeats: @2\n", 1, "YAML cannot read it"),
    ("seed: 2024-02-30\n", 1, "YAML cannot read the value `2024-02-30` (day is out of range for month)"),
    ("model: !!python/object/apply:os.system [ls]\n", 1, "could not determine a constructor"),
])
def test_unreadable_yaml_is_one_line_with_its_line_number(text, line, words):
    message = problem_of(text)
    assert message.startswith(f"config/config.yaml line {line}: ") and words in message
    assert "\n" not in message


def test_readable_yaml_has_no_problem():
    data, problem = read_yaml(ROOT / "config/config.yaml")
    assert problem is None and isinstance(data, dict)


def test_an_alias_bomb_is_refused_before_anything_expands_it():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    assert problem_of(bomb, "big.yaml").startswith("big.yaml: more than 100,000 values once its aliases")
    assert problem_of("a: &a [1, *a]\n") is not None  # an alias inside itself: endless once expanded
    # aliases that expand to a page of settings are fine
    assert problem_of("base: &base {lr: 0.1, depth: 4}\nmodel: {init_args: *base}\ndata: {init_args: *base}\n") is None


def test_a_number_python_will_not_convert_is_one_line():
    """int() refuses more than 4300 digits with a ValueError, which yaml.safe_load let through."""
    assert problem_of("max_epochs: 3\nseed: " + "9" * 5000 + "\n") == (
        "config/config.yaml line 2: a whole number of 5,000 digits, more than any setting takes (100); fix the value")
    assert parse_yaml("seed: " + "9" * 30 + "\n", "c")[0] == {"seed": int("9" * 30)}  # the schema names its bound


@pytest.mark.parametrize("bomb", ["a: " + "[" * 5000 + "]" * 5000, "a:\n" + "".join(
    " " * i + f"k{i}:\n" for i in range(1, MAX_DEPTH + 5)), "a: " + "{b: " * 3000 + "1" + "}" * 3000],
                         ids=["lists", "block mappings", "flow mappings"])
def test_nesting_that_would_exhaust_the_recursion_limit_is_one_line(bomb):
    problem = problem_of(bomb)
    assert problem.startswith("config/config.yaml line ") and ": nested more than 50 levels deep" in problem


def test_a_key_given_twice_names_the_key_and_both_lines():
    assert problem_of("max_epochs: 3\nbatch:\n  size: 64\n  scaling: weak\nmax_epochs: 30\n") == (
        "config/config.yaml line 5: key 'max_epochs' is given on lines 1 and 5 of one mapping, and YAML would keep "
        "the second silently; keep one")
    assert "key 'size' is given twice on line 1" in problem_of("batch: {size: 1, size: 2}\n")
    # a merge lends keys that the mapping may override: that is YAML's way of saying "as base, but"
    assert parse_yaml("base: &b {lr: 1, depth: 2}\nmodel:\n  <<: *b\n  lr: 3\n", "c") == (
        {"base": {"lr": 1, "depth": 2}, "model": {"lr": 3, "depth": 2}}, None)
    # the same key in two mappings is two keys
    assert problem_of("model: {init_args: {width: 1}}\ndata: {init_args: {width: 1}}\n") is None


def test_a_yte_template_is_refused_as_code():
    assert problem_of("__use_yte__: true\nseed: ?1+1\n", "overlay.yaml") == (
        "overlay.yaml: '__use_yte__' at its top level would make Snakemake evaluate the file as a yte template, "
        "i.e. run the Python in it; ddpscale's configs are plain YAML: remove the key")
    assert problem_of("__use_yte__: false\n") is not None  # no key Snakemake reads as code, whatever its value
    assert problem_of("model: {init_args: {__use_yte__: 1}}\n") is None  # only the top level is yte's


def test_a_config_that_is_not_utf8_or_is_huge_is_named_with_its_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("experiment: café\n", encoding="utf-8")
    assert read_yaml(good) == ({"experiment": "café"}, None)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("seed: 1\nexperiment: café\n".encode("latin-1"))
    assert read_yaml(latin, "overlay.yaml") == (None, ("overlay.yaml line 2: byte 0xe9 is not UTF-8 text; save the "
                                                       "file as UTF-8 (or retype that line)"))
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    data, problem = read_yaml(huge, "huge.yaml")
    assert data is None and problem.startswith("huge.yaml: 1,048,577 bytes, more than a config's 1,048,576")


def test_what_is_not_a_regular_file_is_named(tmp_path):
    assert read_yaml(tmp_path, "config") == (None, ("config: is a directory, not a config file; name the YAML file "
                                                   "itself"))
    assert read_yaml(tmp_path / "gone.yaml", "gone.yaml")[1].startswith("gone.yaml: no such file")
    assert read_yaml("/dev/zero", "z")[1] == ("z: is not a regular file (a FIFO, socket or device), not a config "
                                              "file; name the YAML file itself")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    done = threading.Event()
    result = []

    def read():
        result.append(read_yaml(fifo, "fifo.yaml"))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    # open() without O_NONBLOCK waits for a writer forever: the wait below would run out
    assert done.wait(timeout=30), "reading a FIFO waited for a writer"
    assert result == [(None, ("fifo.yaml: is not a regular file (a FIFO, socket or device), not a config file; "
                             "name the YAML file itself"))]
