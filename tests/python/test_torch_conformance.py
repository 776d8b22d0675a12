"""The communicator conformance suite (tests/comm/communicator_conformance.h, the one test body comm/local and comm/mpi
run) over the TorchCommunicator on a gloo group of 3 spawned ranks: the C++ suite runs in each rank's process
(tests/comm/torch_conformance_module.cc) on gradcomp's Communicator over torch.distributed."""
import torch.distributed as dist
import torch.multiprocessing as mp

import helpers
from gradcomp import _gradcomp as _C
from gradcomp.torch import exchange

WORLD = 3


def _worker(rank, world, url):
    import _gradcomp_conformance
    helpers.init_gloo(rank, world, url)
    try:
        comm = _C.TorchCommunicator(exchange.ProcessGroupAdapter())
        assert comm.backend == "torch:gloo" and comm.rank == rank and comm.size == world
        rc = _gradcomp_conformance.run(comm)
        assert rc == 0, f"rank {rank}: the conformance suite failed on the torch communicator (GoogleTest exit {rc})"
    finally:
        dist.destroy_process_group()


def test_conformance_over_torch_gloo_3_ranks():
    mp.spawn(_worker, args=(WORLD, helpers.rendezvous()), nprocs=WORLD, join=True)
