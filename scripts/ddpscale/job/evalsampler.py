"""Each validation and test sample evaluated once, when the data does not divide by the world size.

Evaluation needs no equal step counts, so the built-in data modules shard validation and test
without padding (Lightning 2.6 pads them too, and warns; it uses an unpadded sampler only for
predict): Lightning's mean of a logged metric is weighted by batch size across ranks (the sums
and batch counts are all-reduced), so the accuracy is then over each sample exactly once.
Training throughput counts each sample once too (ddpscale.job.samplecount).
"""

from __future__ import annotations

import torch.distributed as dist


def evaluation_sampler(dataset):
    """An unpadded, unshuffled shard of the dataset for validation or test under DDP (None on
    one rank). A DistributedSampler subclass, so Lightning keeps it instead of padding."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    from pytorch_lightning.overrides.distributed import UnrepeatedDistributedSampler

    return UnrepeatedDistributedSampler(dataset, shuffle=False)
