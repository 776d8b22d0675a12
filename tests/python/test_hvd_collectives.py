"""Horovod API parity of the collectives, topology, process sets and utilities on the torch backend (mp.spawn +
gloo, 2 and 4 ranks); the checks are test_hvd_collectives_mpi.py's, which runs them under mpirun on the mpi and
runtime backends."""
import os

import torch.multiprocessing as mp

import gradcomp.torch as hvd
import helpers


def _worker(rank, world, url):
    helpers.watchdog()
    os.environ.update(GRADCOMP_INIT_METHOD=url, RANK=str(rank), WORLD_SIZE=str(world), GRADCOMP_TORCH_PG="gloo",
                      LOCAL_WORLD_SIZE=str(world))
    import test_hvd_collectives_mpi as checks
    hvd.init(backend="torch", process_sets=[checks.INIT_SET])
    checks.run_all()
    hvd.shutdown()


def test_hvd_collectives_2_ranks():
    mp.spawn(_worker, args=(2, helpers.rendezvous()), nprocs=2, join=True)


def test_hvd_collectives_4_ranks():
    mp.spawn(_worker, args=(4, helpers.rendezvous()), nprocs=4, join=True)
