"""The probe's copy of the run's LightningModule, attached to the run's trainer through a view.

The probe times the user's training_step on the module as Lightning hands it to the user's
code: set up (setup, configure_model, on its device, in its dtype) and attached to a trainer
whose estimated_stepping_batches, world_size, global_rank and datamodule are the run's, so a
configure_optimizers or a data module written from `self.trainer` works as it does in
training. It runs on a copy (LightningModule.__getstate__ leaves the trainer out), and the
view forwards every attribute to the run's trainer except the training state, which is the
probe's own:

- optimizers, lr_scheduler_configs and the LightningOptimizer wrappers, from the copy's own
  configure_optimizers(): self.optimizers(), self.lr_schedulers(), toggle_optimizer and
  clip_gradients act on them (never on copied optimizers: torch's LRScheduler wraps
  optimizer.step around a weak reference to the optimizer it was built with, so a copy of
  an optimizer would step the run's);
- strategy.backward and strategy.optimizer_step, where manual_backward and a
  LightningOptimizer's step land: the probe's backward and step (its DDP wrapper, its loss
  scaler; ddpscale.job.stepprobe.Runner);
- lightning_module and model are the copy, and batches reach the device through the copy's
  transfer hooks;
- what the copy sets on its trainer stays on the view (self.trainer.should_stop = True in a
  probed step does not stop the run).

The copy's log and log_dict do nothing: a probed step logged into the run's results would
count in its metrics (and LightningModule.log raises outside a hook it knows). Its learning
rate schedules do not advance: the probe runs more steps than a schedule may be sized for
(OneCycleLR raises past total_steps), and a schedule's step costs nothing measurable.
"""

from __future__ import annotations

import copy
import warnings

import pytorch_lightning as pl
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.core.optimizer import LightningOptimizer, _init_optimizers_and_lr_schedulers, _MockOptimizer
from pytorch_lightning.utilities import CombinedLoader
from torch.utils.data import DataLoader

from ddpscale.job import compiling
from ddpscale.run.usermodule import PluginError

# What pytorch_lightning.utilities.compile.from_compiled sets on the module it compiles:
# compiled methods as instance attributes bound to that module, and the original ones.
COMPILED_METHODS = ("forward", "training_step", "validation_step", "test_step", "predict_step")


def _ignore(*args, **kwargs) -> None:
    return None


class _Forwarding:
    """Every attribute not set on this object is the wrapped object's; what is set stays here."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    def __getattr__(self, name):
        return getattr(self.__dict__["_wrapped"], name)


class StrategyView(_Forwarding):
    """The run's strategy as the copy sees it (see the module's docstring)."""

    def __init__(self, strategy, module):
        super().__init__(strategy)
        self.lightning_module = self.model = module
        self.optimizers, self.lr_scheduler_configs, self._lightning_optimizers = [], [], []
        self.runner = None  # the probe's steps (measurement.stepprobe.Runner), set once built

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        return self.runner.backward(closure_loss, *args, **kwargs)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        return self.runner.optimizer_step(optimizer, closure, **kwargs)

    def batch_to_device(self, batch, device=None, dataloader_idx: int = 0):
        # the strategy's own code, run with this view as self: its lightning_module is the copy
        return type(self._wrapped).batch_to_device(self, batch, device, dataloader_idx)


class TrainerView(_Forwarding):
    """The run's trainer as the copy sees it (see the module's docstring)."""

    def __init__(self, trainer, module):
        super().__init__(trainer)
        self.strategy = StrategyView(trainer.strategy, module)
        self.lightning_module = self.model = module

    @property
    def optimizers(self) -> list:
        return self.strategy.optimizers

    @property
    def lr_scheduler_configs(self) -> list:
        return self.strategy.lr_scheduler_configs


def eager_copy(module: pl.LightningModule) -> pl.LightningModule:
    """A deep copy of the module running its own methods. A module compiled with from_compiled
    holds compiled methods bound to itself as instance attributes, which a copy would keep
    calling; the copy drops them (and their compile context) and gets the class's methods."""
    context = getattr(module, "_compiler_ctx", None)
    copied = copy.deepcopy(module, {} if context is None else {id(context): None})
    if context is not None:
        for name in COMPILED_METHODS:
            copied.__dict__.pop(name, None)
        copied._compiler_ctx = None
    return copied


def attach(trainer, module: pl.LightningModule, compile_mode: str = "none"):
    """(copy, view): a training copy of the run's module, compiled again if the run's is,
    attached to a view of the run's trainer, its logging silenced."""
    copied = eager_copy(module)
    if getattr(module, "_compiler_ctx", None) is not None:
        copied = compiling.wrap(copied, compile_mode)
    for part in copied.modules():
        if isinstance(part, pl.LightningModule):
            part.log = part.log_dict = _ignore
    view = TrainerView(trainer, copied)
    copied.trainer = view
    # each submodule keeps its train or eval mode: Lightning 2.6 trains modules in the modes
    # the user left them in (it only warns about eval ones), so the probe does too
    return copied, view


def build_optimizers(view: TrainerView) -> list:
    """The copy's optimizers from its own configure_optimizers(), parsed as Lightning parses
    them for training, set on the view; its schedules held still."""
    module = view.lightning_module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's "this fit will run with no optimizer": said below
        optimizers, configs = _init_optimizers_and_lr_schedulers(module)
    if all(isinstance(o, _MockOptimizer) for o in optimizers):
        raise PluginError(f"{type(module).__name__}.configure_optimizers() returned no optimizer: Lightning "
                          "trains without one, but the probe times an optimizer step")
    for config in configs:
        config.scheduler.step = _ignore
    strategy = view.strategy
    strategy.optimizers, strategy.lr_scheduler_configs = optimizers, configs
    strategy._lightning_optimizers = [LightningOptimizer._to_lightning_optimizer(o, strategy) for o in optimizers]
    return optimizers


def _own_iterator(loader: DataLoader) -> DataLoader:
    """The loader itself, or, with persistent workers, a shallow copy: such a loader keeps one
    iterator, the one training's first epoch will read, which the probe must not advance."""
    if loader.persistent_workers and loader.num_workers > 0:
        loader = copy.copy(loader)
        loader._iterator = None
    return loader


def batch_source(view: TrainerView):
    """next_batch(): a batch of the run's own train dataloader, as the training loop draws and
    moves it (Lightning's sampler in place, precision conversion, the copy's transfer hooks,
    the strategy's device); several loaders are combined as training combines them. The
    dataloader must be built already (trainer.fit_loop.setup_data())."""
    loaders = view.train_dataloader
    if loaders is None:
        raise ValueError("the run has no train dataloader (no training_step, or limit_train_batches 0)")
    combined = CombinedLoader(apply_to_collection(loaders, DataLoader, _own_iterator), "max_size_cycle")
    state = {"iterator": iter(combined), "fresh": True}
    module = view.lightning_module

    def next_batch():
        try:
            batch, _, _ = next(state["iterator"])
        except StopIteration:
            if state["fresh"]:
                raise ValueError("the train dataloader yields no batches") from None
            state["iterator"] = iter(combined)  # an epoch is shorter than the probe: start the next one
            batch, _, _ = next(state["iterator"])
        state["fresh"] = False
        batch = view.precision_plugin.convert_input(batch)
        batch = module._on_before_batch_transfer(batch, dataloader_idx=0)
        return view.strategy.batch_to_device(batch, dataloader_idx=0)

    return next_batch


def scales_loss(precision_plugin) -> bool:
    """Whether the run's precision scales the loss (16-mixed): the probe then needs a scaler of
    its own (stepping the run's would move its scale)."""
    return getattr(precision_plugin, "scaler", None) is not None
