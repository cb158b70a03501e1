"""The run's accuracy: the epoch metric after every epoch's validation, for time to accuracy
(report/timetoacc.py), and a line in the log saying whether the metric the report compares is logged.

A larger global batch can need more epochs to reach the same accuracy, so throughput alone can
promise a speedup the training never delivers. The callback records the metric (config
accuracy.epoch_metric, e.g. val_acc) once per epoch on rank 0; with_elapsed then pairs each
value with the time trained so far. Its state is saved in every checkpoint, like
EpochTiming', so a run resumed after a kill keeps the epochs it already validated.

Say in the run's log, at its first validation, whether the metric the report will compare
(config accuracy.metric) is logged: a misnamed metric shows minutes into the baseline, not
after every topology has trained. Rank 0 prints; nothing is stopped (the report then says
accuracy was not compared, and what the runs logged).

The metric's name reaches train.py outside its run flags (the workflow puts it in the jobs'
environment), so choosing another metric for the report reruns no training.
"""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerFn


def scalars(trainer) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}


class ValHistory(pl.Callback):
    def __init__(self, metric: str | None):
        self.metric = metric
        self.history: list[dict] = []  # {"epoch", "value"}, one per validated epoch
        self.logged: list[str] | None = None  # what the last validation logged, for the reason

    def state_dict(self) -> dict:
        return {"history": self.history, "logged": self.logged}

    def load_state_dict(self, state: dict) -> None:
        self.history = [dict(entry) for entry in state.get("history", [])]
        self.logged = state.get("logged")

    def on_validation_end(self, trainer, pl_module) -> None:
        # throughput mode's validations after its stop (trainer.validate) trained nothing more
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING or not trainer.is_global_zero \
                or not self.metric:
            return
        logged = scalars(trainer)
        self.logged = sorted(logged)
        if self.metric not in logged:
            return
        value = logged[self.metric]
        entry = {"epoch": int(trainer.current_epoch), "value": value if math.isfinite(value) else None}
        # val_check_interval < 1 validates several times an epoch: the epoch's last one counts,
        # the value the epoch ended with
        self.history = [e for e in self.history if e["epoch"] != entry["epoch"]] + [entry]

    def reason(self) -> str | None:
        """Why the history is empty, or None when it is not."""
        if self.history:
            return None
        if not self.metric:
            return "no epoch metric was named (train.py --epoch-metric, config accuracy.epoch_metric)"
        if self.logged is None:
            return "no validation ran"
        names = ", ".join(self.logged) or "nothing"
        return f"{self.metric} was not logged at validation; logged: {names}"

    def section(self, logged: dict[str, float], epoch_times: list[float]) -> dict:
        """The record's accuracy section (ddpscale.core.record.SECTIONS; rank 0, after fit and the
        test pass): every scalar the module logged (logged, as scalars read it), the usual three
        by name, and the epoch metric's history, each entry with the time training took to reach
        it (with_elapsed; epoch_times: the record's epoch_times_s)."""
        return {"val_loss": logged.get("val_loss"), "val_acc": logged.get("val_acc"),
                "test_acc": logged.get("test_acc"), "logged_metrics": logged,
                "val_history": with_elapsed([dict(e) for e in self.history], epoch_times),
                "val_history_metric": self.metric, "val_history_reason": self.reason()}


def with_elapsed(history: list[dict], epoch_times: list[float]) -> list[dict]:
    """Each entry with elapsed_s: the summed time (train + validation) of the finished epochs up
    to and including its own, i.e. what training took to reach that value. epoch_times holds one
    entry per finished epoch, in order (metrics.json epoch_times_s); an entry whose epoch did not
    finish (stopped after its validation) gets None, not a guess."""
    running, total = [], 0.0
    for seconds in epoch_times:
        total += seconds
        running.append(total)
    return [{**e, "elapsed_s": running[e["epoch"]] if 0 <= e["epoch"] < len(running) else None} for e in history]


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
