"""Synthetic token streams with learnable structure and a known floor, made on the fly from a seed.

The chain: a hidden random walk on Z_V, x_{t+1} = (x_t + s_t) mod V, with steps s_t drawn
i.i.d. from a fixed random distribution q over K fixed random nonzero offsets, observed
through a fixed random permutation of the vocabulary (token = perm[x]). Every token then has
K possible successors with probabilities q, so the best reachable next-token loss is the
entropy H(q) (nats, `loss_floor`) and the best reachable accuracy max(q) (`accuracy_ceiling`).
The start state is uniform, which is the walk's stationary distribution, so every position
of a sequence has the same statistics. A model has to learn a V x K successor table: the
permutation hides the arithmetic.

A sequence is cumsum + mod + gather over the whole batch; per sequence only its own CPU
torch.Generator draws T + 1 uniforms. Each sequence is made from (seed, its global index):

    train:  index = (epoch * steps_per_epoch + step) * global_batch + rank * batch_size + i
    val:    VAL_OFFSET + step * global_batch + rank * batch_size + i      (every epoch alike)
    test:   TEST_OFFSET + ...

with global_batch = batch_size x world size. Under strong scaling the global batch of a step
is then the same sequences whatever the world size, and a resumed run (Lightning calls
sampler.set_epoch at each epoch start) sees the stream an uninterrupted one would. Every rank
takes steps_per_epoch training steps and val_batches / test_batches evaluation steps.

torch's CPU generator (mt19937) keeps only the low 32 bits of a seed, so the generator's seed
is (a hash of `seed` + index) mod 2**32 and the three index spaces split those 2**32 values:
training below 2**31 sequences, validation and test 2**30 each. Distinct indices never share
a stream (offsets such as 2**40 would silently repeat the training sequences).

Like ddpscale.workloads.resident.ResidentBatches, the loaders are plain iterables: Lightning only
injects a DistributedSampler into real DataLoaders, so rank and world come from
torch.distributed, and `sampler` (self, with set_epoch) and `batch_sampler = None` are what
Lightning looks up. While a Trainer runs, batches are made on the CPU and moved to its root
device (from pinned memory, non-blocking, on CUDA), the probe's included (it draws from the
run's own loader); outside a running Trainer (the FLOP count after training uses the CPU copy
of the model) they stay on the CPU.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerStatus

from ddpscale.workloads.resident import rank_and_world

TRAIN_OFFSET = 0
VAL_OFFSET = 2**31
TEST_OFFSET = 2**31 + 2**30
_SPACE = {"train": (TRAIN_OFFSET, VAL_OFFSET), "val": (VAL_OFFSET, TEST_OFFSET), "test": (TEST_OFFSET, 2**32)}


def _mix64(value: int) -> int:
    """splitmix64's finaliser: spreads the user's seed over 64 bits."""
    z = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


class MarkovChain:
    """The fixed chain of a seed: offsets, their probabilities q, the vocabulary permutation."""

    def __init__(self, vocab_size: int, branching: int, seed: int):
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, not {vocab_size}")
        if not 1 <= branching < vocab_size:
            raise ValueError(f"branching must be between 1 and vocab_size - 1 ({vocab_size - 1}), not {branching}")
        self.vocab_size, self.branching, self.seed = vocab_size, branching, seed
        gen = torch.Generator().manual_seed(_mix64(seed) & 0xFFFFFFFF)
        self.perm = torch.randperm(vocab_size, generator=gen)
        # K distinct nonzero offsets: K distinct successors of every state
        self.offsets = torch.randperm(vocab_size - 1, generator=gen)[:branching] + 1
        # q uniform on the simplex (Dirichlet(1)): normalised exponentials
        e = -torch.log1p(-torch.rand(branching, generator=gen, dtype=torch.float64))
        self.q = e / e.sum()
        self.cdf = torch.cumsum(self.q, 0)
        self.loss_floor = float(-(self.q * self.q.log()).sum())
        self.accuracy_ceiling = float(self.q.max())
        self.stream_base = _mix64(seed ^ 0x5EED) & 0xFFFFFFFF

    def sequences(self, indices, length: int) -> torch.Tensor:
        """Token ids (len(indices), length) on the CPU; sequence j is a function of (seed, indices[j])."""
        starts = torch.empty(len(indices), 1, dtype=torch.float64)
        steps = torch.empty(len(indices), length - 1, dtype=torch.float64)
        gen = torch.Generator()
        for row, index in enumerate(indices):
            gen.manual_seed((self.stream_base + int(index)) & 0xFFFFFFFF)
            torch.rand(1, generator=gen, dtype=torch.float64, out=starts[row])
            torch.rand(length - 1, generator=gen, dtype=torch.float64, out=steps[row])
        start = (starts * self.vocab_size).long().clamp_(max=self.vocab_size - 1)
        choice = torch.searchsorted(self.cdf, steps, right=True).clamp_(max=self.branching - 1)
        states = torch.cat([start, self.offsets[choice]], dim=1).cumsum_(1).remainder_(self.vocab_size)
        # index_select, not perm[states]: advanced indexing was 500x slower here (8 ms a batch)
        return self.perm.index_select(0, states.view(-1)).view_as(states)


def _running_device(trainer) -> torch.device | None:
    """The trainer's root device while it runs fit/validate/test, else None (stay on the CPU)."""
    if trainer is None or trainer.state.status != TrainerStatus.RUNNING:
        return None
    return trainer.strategy.root_device


class MarkovBatches:
    """Batches (x, y) of shape (batch_size, seq_len), y = x shifted by one, for one split."""

    def __init__(self, chain: MarkovChain, batch_size: int, seq_len: int, steps: int, split: str = "train",
                 rank: int | None = None, world: int | None = None, device: torch.device | str | None = None):
        if batch_size < 1 or seq_len < 1 or steps < 1:
            raise ValueError(f"batch_size, seq_len and steps must be at least 1 (got {batch_size}, {seq_len}, {steps})")
        if split not in _SPACE:
            raise ValueError(f"split must be one of {sorted(_SPACE)}, not {split!r}")
        if (rank is None) != (world is None):
            raise ValueError("give both rank and world, or neither (then torch.distributed's are used)")
        self.rank, self.world = (rank, world) if rank is not None else rank_and_world()
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world}")
        self.chain, self.batch_size, self.seq_len, self.steps, self.split = chain, batch_size, seq_len, steps, split
        self.device = torch.device(device) if device is not None else None
        self.epoch = 0
        # Lightning calls sampler.set_epoch at every epoch start and looks up batch_sampler
        self.sampler, self.batch_sampler = self, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps

    def indices(self, step: int) -> range:
        """Global indices of this rank's sequences at this step of the current epoch."""
        global_batch = self.batch_size * self.world
        start, end = _SPACE[self.split]
        first_step = self.epoch * self.steps if self.split == "train" else 0
        first = start + (first_step + step) * global_batch + self.rank * self.batch_size
        if first + self.batch_size > end:
            raise ValueError(f"the {self.split} stream has room for {end - start} sequences; epoch {self.epoch} "
                             f"step {step} needs more (fewer steps or epochs, or a smaller batch)")
        return range(first, first + self.batch_size)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.chain.sequences(self.indices(step), self.seq_len + 1)
        if self.device is not None and self.device.type != "cpu":
            if self.device.type == "cuda":
                tokens = tokens.pin_memory()
            tokens = tokens.to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    def __iter__(self):
        for step in range(self.steps):
            yield self.batch(step)


class MarkovTokens(pl.LightningDataModule):
    """Fresh training sequences every step from a fixed seed; fixed validation and test sets.

    batch_size is per device (the workflow sets it). Per epoch every rank takes
    steps_per_epoch training steps, val_batches validation and test_batches test steps.
    `loss_floor` (nats) and `accuracy_ceiling` are the best a model can reach.
    """

    def __init__(self, batch_size: int = 16, vocab_size: int = 50304, seq_len: int = 1024,
                 steps_per_epoch: int = 100, val_batches: int = 8, test_batches: int = 8, branching: int = 4,
                 seed: int = 0, num_workers: int = 0):
        super().__init__()
        if num_workers > 0:
            raise ValueError("MarkovTokens makes each batch in the training process (a few vectorised ops), "
                             "so it takes no DataLoader workers; set dataloader.num_workers: 0")
        self.batch_size, self.seq_len = batch_size, seq_len
        self.steps = {"train": steps_per_epoch, "val": val_batches, "test": test_batches}
        self.chain = MarkovChain(vocab_size, branching, seed)
        self.loss_floor = self.chain.loss_floor
        self.accuracy_ceiling = self.chain.accuracy_ceiling

    def loader(self, split: str, rank: int | None = None, world: int | None = None) -> MarkovBatches:
        return MarkovBatches(self.chain, self.batch_size, self.seq_len, self.steps[split], split,
                             rank=rank, world=world, device=_running_device(self.trainer))

    def train_dataloader(self):
        return self.loader("train")

    def val_dataloader(self):
        return self.loader("val")

    def test_dataloader(self):
        return self.loader("test")
