"""The probe's copy of the run's module and its view of the run's trainer
(ddpscale.job.probe.inrun), in this process on one rank: modules written the ordinary Lightning way (a schedule
sized by self.trainer, a data module sharding from self.trainer, manual optimisation) probe
as they train, the probe never touches the run's weights, optimizer, schedule or metrics, and
a probe that cannot measure is recorded n/a while the run trains on."""

from __future__ import annotations


import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from ddpscale.job import build
from ddpscale.job.device import compiling
from ddpscale.job.probe import inrun

from helpers.probe import fit_with_probe, run_args


class Snapshot(pl.Callback):
    """The run's weights as the probe found them (this callback goes first)."""

    def on_fit_start(self, trainer, pl_module):
        self.weights = {k: v.clone() for k, v in pl_module.state_dict().items()}


def test_the_copy_sees_the_runs_trainer_and_keeps_its_own_training_state(usermods):
    seen = {}

    class Look(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            trainer.fit_loop.setup_data()
            copied, view = inrun.attach(trainer, pl_module)
            optimizers = inrun.build_optimizers(view)
            seen.update(trainer=trainer, module=pl_module, copied=copied, view=view, optimizers=optimizers)
            # what the copy does to its trainer stays on the view; its log goes nowhere
            copied.trainer.should_stop = True
            copied.log("probe_loss", 1.0)
            copied.log_dict({"probe_acc": 1.0})
            seen["run_stopped"] = trainer.should_stop
            trainer.should_stop = True

    model = usermods.cnn.SmallCNN()
    data = usermods.imagedata.TrainerShardedImages(batch_size=16, train_samples=37)
    trainer = build.build_trainer(run_args(16), [Look()])
    trainer.fit(model, datamodule=data)
    copied, view, optimizers = seen["copied"], seen["view"], seen["optimizers"]

    assert copied is not model and type(copied) is type(model) and copied.trainer is view
    # forwarded: what a module reads from its trainer is the run's
    assert view.estimated_stepping_batches == trainer.estimated_stepping_batches == 3
    assert (view.world_size, view.global_rank, view.global_step) == (1, 0, 0)
    assert view.datamodule is data and view.strategy.root_device == trainer.strategy.root_device
    # replaced: the optimizers, schedules and their wrappers are the copy's own
    copy_params = {id(p) for p in copied.parameters()}
    assert {id(p) for group in optimizers[0].param_groups for p in group["params"]} == copy_params
    assert view.optimizers == optimizers and trainer.optimizers[0] is not optimizers[0]
    assert copied.optimizers().optimizer is optimizers[0]
    assert copied.lr_schedulers() is view.lr_scheduler_configs[0].scheduler
    assert copied.lr_schedulers() is not trainer.lr_scheduler_configs[0].scheduler
    assert view.lightning_module is copied and view.strategy.lightning_module is copied
    assert seen["run_stopped"] is False and "probe_loss" not in trainer.callback_metrics
    # LightningModule methods that read the trainer act on the copy's optimizers
    copied.toggle_optimizer(copied.optimizers())
    copied.untoggle_optimizer(copied.optimizers())
    x, y = next(iter(DataLoader(data.train_set, batch_size=4)))
    torch.nn.functional.cross_entropy(copied(x), y).backward()
    copied.clip_gradients(optimizers[0], gradient_clip_val=0.5, gradient_clip_algorithm="norm")
    assert torch.stack([p.grad.norm() for p in copied.parameters()]).norm() <= 0.5 + 1e-6
    # the copy's schedule holds still (OneCycleLR would raise past its total_steps)
    for _ in range(5):
        copied.lr_schedulers().step()
    assert copied.lr_schedulers().last_epoch == 0


def test_a_probe_leaves_the_runs_weights_optimizer_schedule_and_metrics_untouched(usermods):
    snapshot = Snapshot()
    model = usermods.cnn.SmallCNN()  # OneCycleLR sized by self.trainer.estimated_stepping_batches
    data = usermods.imagedata.TrainerShardedImages(batch_size=16, train_samples=37)  # sampler from self.trainer
    probed, trainer = fit_with_probe(model, data, snapshot)
    record = probed.record
    assert probed.failure is None and record["status"] == "ok", record
    assert record["world_size"] == 1 and record["node_ranks"] == [0] and record["step"]["compute_s"] > 0
    assert record["step"]["steps"] == 4 and record["step"]["optimization"] == "automatic"
    assert record["gradient_numel"] == sum(p.numel() for p in model.parameters())
    for name, value in model.state_dict().items():
        assert torch.equal(value, snapshot.weights[name]), name
    assert trainer.optimizers[0].state == {} and trainer.global_step == 0
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 0
    assert "train_loss" not in trainer.callback_metrics


@pytest.mark.parametrize("model_class", ["manual.ManualCNN", "cnn.SmallCNNStepLR"])
def test_manual_optimisation_and_a_steplr_module_probe(usermods, model_class):
    module, name = model_class.split(".")
    model = getattr(getattr(usermods, module), name)()
    snapshot = Snapshot()
    probed, trainer = fit_with_probe(model, usermods.imagedata.DistShardedImages(batch_size=16, train_samples=37),
                                     snapshot)
    assert probed.failure is None and probed.record["step"]["compute_s"] > 0, probed.failure
    assert probed.record["step"]["optimization"] == ("manual" if module == "manual" else "automatic")
    assert trainer.optimizers[0].state == {}
    assert all(torch.equal(v, snapshot.weights[k]) for k, v in model.state_dict().items())


def test_a_probe_that_cannot_measure_is_na_and_the_run_trains_on(usermods, capsys):
    model = usermods.unprobeable.NoOptimizerCNN()
    probed, trainer = fit_with_probe(model, usermods.imagedata.TrainerShardedImages(batch_size=16, train_samples=37),
                                     alone=False)
    assert trainer.current_epoch == 1 and trainer.state.finished, "the run did not train"
    record = probed.record
    assert record["status"] == "n/a" and record["topology"] == "1x1" and record["world_size"] == 1
    assert record["reason"] == ("PluginError: NoOptimizerCNN.configure_optimizers() returned no optimizer: "
                                "Lightning trains without one, but the probe times an optimizer step "
                                "(in building the optimizers)")
    assert f"ddpscale probe: n/a for 1x1: {record['reason']}; training goes on" in capsys.readouterr().out


def test_a_failing_step_is_named_with_what_the_probe_was_doing(usermods):
    class NoneSometimes(usermods.cnn.SmallCNNStepLR):
        def training_step(self, batch, batch_idx):
            return None if batch_idx == 2 else super().training_step(batch, batch_idx)

    probed, trainer = fit_with_probe(NoneSometimes(), usermods.imagedata.TrainerShardedImages(batch_size=16))
    assert probed.record["status"] == "n/a"
    assert probed.record["reason"] == (
        "ValueError: training_step returned NoneType for batch 2, not a loss tensor or a dict with 'loss'; the "
        "probe times whole steps (in running training steps on this rank alone)")


def test_reasons_name_the_rank_that_failed():
    failure = inrun.failure_of(RuntimeError("out of memory\ntraceback lines"), "drawing batches", 3)
    assert failure.reason == "RuntimeError: out of memory (in drawing batches, rank 3)"
    assert inrun.failure_of(KeyError(), "x", 0).reason == "KeyError:  (in x)"


def test_persistent_workers_keep_training_s_own_iterator(usermods):
    """A loader with persistent workers has one iterator, the one training's first epoch reads:
    the probe draws from its own, so the epoch still sees every batch."""
    counted = []

    class Count(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            counted.append(len(batch[0]))

    data = usermods.imagedata.TrainerShardedImages(batch_size=16, train_samples=37, num_workers=1,
                                                   persistent_workers=True)
    probed, _ = fit_with_probe(usermods.cnn.SmallCNN(), data, Count(), alone=False)
    assert probed.record["status"] == "ok" and sum(counted) == 37


def test_a_compiled_module_is_copied_with_its_own_methods_and_compiled_again(usermods):
    """from_compiled leaves compiled methods bound to the original as instance attributes: a
    plain deep copy would train the original. (Compiling happens at the first call, so no
    C++ compiler is needed here.)"""
    model = compiling.wrap(usermods.cnn.SmallCNN(), "default")
    assert model.__dict__["training_step"] is not None  # what from_compiled left on the instance
    eager = inrun.eager_copy(model)
    assert eager._compiler_ctx is None and "training_step" not in eager.__dict__
    assert eager.training_step.__self__ is eager and eager.forward.__self__ is eager
    trainer = build.build_trainer(run_args(), [])
    copied, view = inrun.attach(trainer, model, "default")
    assert copied._compiler_ctx is not None and copied._compiler_ctx["original_training_step"].__self__ is copied
    assert model._compiler_ctx["original_training_step"].__self__ is model  # the run's, as it was


@pytest.mark.parametrize("model_class", ["cnn.SmallCNN", "unprobeable.NoOptimizerCNN"])
def test_the_copy_and_its_optimizers_are_freed_after_the_probe(usermods, monkeypatch, model_class):
    """Before training starts, whether the probe measured or not (no gc.collect() here: the
    probe's own must have freed them)."""
    import weakref

    made = []
    attach = inrun.attach

    def watched(*args, **kwargs):
        copied, view = attach(*args, **kwargs)
        made.append(weakref.ref(copied))
        return copied, view

    monkeypatch.setattr(inrun, "attach", watched)
    module, name = model_class.split(".")
    probed, trainer = fit_with_probe(getattr(getattr(usermods, module), name)(),
                                     usermods.imagedata.TrainerShardedImages(batch_size=16, train_samples=37))
    assert len(made) == 1 and made[0]() is None, "the probe's copy outlived the probe"


def test_the_copy_keeps_each_submodule_s_mode(usermods):
    """Lightning 2.6 trains submodules in the mode the user left them (a frozen BatchNorm in
    eval, say); the probe times the same steps."""
    model = usermods.cnn.SmallCNN()
    model.net[1].eval()
    copied, _ = inrun.attach(build.build_trainer(run_args(), []), model)
    assert copied.training and not copied.net[1].training and copied.net[4].training
