"""Job states as the SLURM executor plugin compares them.

sacct writes a cancelled job's state as "CANCELLED by <uid>". Plugin 2.8.0 compares the whole
text with its list of failed states, so a job cancelled with scancel (by the user, an admin or
a preemption) is never seen to end: Snakemake polls it as running until it is interrupted, and
the other stages wait behind it. (Snakemake-Profiles/slurm, the plugin's predecessor, fixed the
same in its PR #22.) The workflow wraps the plugin's status query so that each state is its
first word, the form the plugin's list has.
"""

from __future__ import annotations

import functools
import inspect

MARK = "_ddpscale_first_word_states"


def first_word(state: str) -> str:
    """'CANCELLED by 1234' -> 'CANCELLED'; a one-word state unchanged."""
    return state.split(None, 1)[0] if state.strip() else state


def first_words(states: dict[str, str] | None) -> dict[str, str] | None:
    return None if states is None else {job: first_word(state) for job, state in states.items()}


def wrap_status_query(module) -> bool:
    """Replace module.query_job_status (a coroutine returning ({job id: state}, seconds), or
    (None, None) when the query failed) with one whose states are first words. Idempotent.
    False where the module has no such coroutine (another plugin version): nothing changed."""
    original = getattr(module, "query_job_status", None)
    if original is None or not inspect.iscoroutinefunction(original):
        return False
    if getattr(original, MARK, False):
        return True

    @functools.wraps(original)
    async def query_job_status(*args, **kwargs):
        states, seconds = await original(*args, **kwargs)
        return first_words(states), seconds

    setattr(query_job_status, MARK, True)
    module.query_job_status = query_job_status
    return True


def wrap_installed_plugin() -> str | None:
    """wrap_status_query on the installed SLURM plugin; a warning line where it cannot be wrapped,
    None where it was or where no SLURM plugin is installed (nothing to fix)."""
    try:
        import snakemake_executor_plugin_slurm as slurm_plugin
    except ImportError:
        return None
    if wrap_status_query(slurm_plugin):
        return None
    return ("warning: this SLURM executor plugin has no query_job_status; a job cancelled with scancel may not "
            "be noticed (ddpscale is tested with the version in requirements.txt)")
