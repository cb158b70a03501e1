"""sacct's "CANCELLED by <uid>" reaches the SLURM plugin as CANCELLED (ddpscale.plan.site.pluginstates).
The whole path, a job cancelled on the test cluster while snakemake waits, is
tests/slurm/test_slurm.py::test_cancelled_run_is_the_only_one_resubmitted."""

from __future__ import annotations

import asyncio
import types

import pytest
import snakemake_executor_plugin_slurm

from ddpscale.plan.site.pluginstates import first_word, wrap_status_query


@pytest.mark.parametrize("state, expected", [
    ("CANCELLED by 0", "CANCELLED"),
    ("CANCELLED by 41234", "CANCELLED"),
    ("COMPLETED", "COMPLETED"),
    ("NODE_FAIL", "NODE_FAIL"),
    ("", ""),
])
def test_first_word(state, expected):
    assert first_word(state) == expected


def fake_plugin(answer):
    calls = []

    async def query_job_status(command, logger):
        calls.append(command)
        return answer

    return types.SimpleNamespace(query_job_status=query_job_status), calls


def test_the_wrapped_query_gives_first_words_and_passes_the_command_through():
    module, calls = fake_plugin(({"7": "CANCELLED by 0", "8": "RUNNING"}, 0.01))
    assert wrap_status_query(module)
    assert asyncio.run(module.query_job_status("sacct -X", None)) == ({"7": "CANCELLED", "8": "RUNNING"}, 0.01)
    assert calls == ["sacct -X"]


def test_a_failed_query_stays_failed_and_wrapping_twice_wraps_once():
    module, calls = fake_plugin((None, None))
    assert wrap_status_query(module) and wrap_status_query(module)
    assert asyncio.run(module.query_job_status("sacct", None)) == (None, None)
    assert calls == ["sacct"]


def test_a_plugin_without_the_coroutine_is_left_alone():
    module = types.SimpleNamespace(query_job_status=lambda command, logger: ({}, 0.0))
    assert not wrap_status_query(module)
    assert not wrap_status_query(types.SimpleNamespace())


def test_the_installed_plugin_has_the_query_the_workflow_wraps():
    """An upgraded plugin that renamed it would silently bring the hang back."""
    module = types.SimpleNamespace(query_job_status=snakemake_executor_plugin_slurm.query_job_status)
    assert wrap_status_query(module)


def test_the_installed_plugin_is_wrapped_where_the_workflow_asks():
    import snakemake_executor_plugin_slurm as slurm_plugin

    from ddpscale.plan.site.pluginstates import MARK, wrap_installed_plugin

    assert wrap_installed_plugin() is None
    assert getattr(slurm_plugin.query_job_status, MARK, False)
