"""Elastic training with horovod.torch.elastic's API on torchrun's elastic agent.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    train(state)

Run under ``torchrun --nnodes=MIN:MAX --nproc_per_node=1 --max_restarts=N --rdzv_backend=c10d
--rdzv_endpoint=HOST:PORT`` (torch backend, gloo or NCCL). docs/elastic.md has the design: commits in memory and on
disk, what happens to residuals when ranks leave or join, and why the MPI backend is not elastic.
"""
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from .handlers import (LRSchedulerStateHandler, ModelStateHandler, OptimizerStateHandler, SamplerStateHandler,
                       StateHandler, get_handler_registry, set_handler_registry)
from .runner import RESTART_EXIT_CODE, run_fn
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState


def run(func):
    """Decorator: runs `func(state, ...)` elastically. After a failed collective the state returns to its last
    commit and `func` is entered again once the ranks are re-formed (in this process, or, under torchrun, in the
    process the agent restarts, which resumes from the commit on disk); after a reset every rank's state is rank 0's
    (state.sync()). `func`'s first argument must be a State; no collective may run before it inside `func`'s caller
    between resets."""
    return run_fn(func)


__all__ = ["run", "run_fn", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
           "HostsUpdatedInterrupt", "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "LRSchedulerStateHandler", "SamplerStateHandler", "get_handler_registry", "set_handler_registry",
           "RESTART_EXIT_CODE"]
