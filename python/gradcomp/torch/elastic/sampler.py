"""ElasticSampler (horovod.torch.elastic's): partitions a dataset over the ranks, records which samples were
processed, and after a reset repartitions the rest of the epoch over the new set of ranks."""
import math
import random

import torch.utils.data

from ..context import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Like DistributedSampler, but tracked by a TorchState: call record_batch(batch_idx, batch_size) after each
    processed batch and set_epoch(epoch + 1) at the end of an epoch (not its start); after a reset the samples not
    yet processed in the epoch are split over the new ranks. `seed` must be the same on every rank."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: clears the processed indices and reshuffles (seed + epoch)."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks the samples of this rank's batch `batch_idx` (of `batch_size`) as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's dataset indices of batch `batch_idx` in the current iteration order."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self):
        """Re-reads rank and size and splits the epoch's unprocessed samples over them."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._partition()

    def _partition(self):
        indices = list(self.remaining_indices)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        while indices and len(indices) < self.total_size:  # pad to a multiple of the ranks, as Horovod
            indices += indices[:self.total_size - len(indices)]
        return indices[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        self.indices = self._partition()
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
