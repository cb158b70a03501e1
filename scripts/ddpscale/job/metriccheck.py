"""Say in the run's log, at its first validation, whether the metric the report will compare
(config accuracy.metric) is logged: a misnamed metric shows minutes into the baseline, not
after every topology has trained. Rank 0 prints; nothing is stopped (the report then says
accuracy was not compared, and what the runs logged).

The metric's name reaches train.py outside its run flags (the workflow puts it in the jobs'
environment), so choosing another metric for the report reruns no training.
"""

from __future__ import annotations

import pytorch_lightning as pl

from ddpscale.job.runinfo import scalars


def _names(logged: dict) -> str:
    return ", ".join(sorted(logged)) or "nothing"


def first_validation_line(metric: str, logged: dict[str, float], test_pass: bool) -> str:
    """What the log says after the first validation."""
    if metric in logged:
        return f"ddpscale: accuracy.metric {metric} is logged ({logged[metric]:.4g} after the first validation)"
    if test_pass:
        return (f"ddpscale: accuracy.metric {metric} is not logged by validation (it logged: {_names(logged)}); "
                "it may still come from the test pass after training")
    return (f"ddpscale: warning: accuracy.metric {metric} is not logged (the first validation logged: "
            f"{_names(logged)}) and this run has no test pass, so the report will not compare accuracy; "
            "set accuracy.metric to one of the names logged")


def end_line(metric: str, logged: dict[str, float]) -> str | None:
    """What the log says once the run has trained (and tested), if the metric never came."""
    if metric in logged:
        return None
    return (f"ddpscale: warning: accuracy.metric {metric} was not logged by this run (it logged: "
            f"{_names(logged)}), so the report will not compare accuracy; set accuracy.metric to one of those names")


class MetricCheck(pl.Callback):
    def __init__(self, metric: str | None, test_pass: bool):
        self.metric, self.test_pass = metric, test_pass
        self.said = False

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.said or not self.metric:
            return
        self.said = True
        if trainer.is_global_zero:
            print(first_validation_line(self.metric, scalars(trainer), self.test_pass), flush=True)
