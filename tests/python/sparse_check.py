"""Sparse gradients in DistributedOptimizer (Embedding(sparse=True): allgather of indices and values, and
sparse_as_dense) against each rank's dense gradient computed here. One check body for every backend: test_hvd_optimizer.py
calls check_sparse on the torch backend (mp.spawn); under mpirun this file runs it on GRADCOMP_BACKEND (mpi, runtime,
torch) and exits non-zero on failure:

    GRADCOMP_BACKEND=torch mpirun -np 2 python tests/python/sparse_check.py
"""
import sys

import torch

import gradcomp.torch as hvd


def close(got, want, tol, what):
    scale = float(want.double().abs().max()) + 1e-12
    err = float((got.double() - want.double()).abs().max()) / scale
    assert err <= tol, f"{what}: relative error {err:.3g}"


def check_sparse(rank, world, sparse_as_dense):
    """DistributedOptimizer with an Embedding(sparse=True): the gradient stays sparse and is every rank's, averaged
    (allgather of indices and values, or dense with sparse_as_dense); SGD applies it."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 6, sparse=True)
    head = torch.nn.Linear(6, 1)
    params = list(emb.named_parameters(prefix="emb")) + list(head.named_parameters(prefix="head"))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1), params,
                                   sparse_as_dense=sparse_as_dense)
    idx = [torch.tensor([[1, 2, 3], [3, 4, 40]]) + r for r in range(world)]
    local = []
    for r in range(world):  # reference: each rank's dense gradient
        e, h = torch.nn.Embedding(50, 6, sparse=True), torch.nn.Linear(6, 1)
        e.load_state_dict(emb.state_dict())
        h.load_state_dict(head.state_dict())
        h(e(idx[r])).sum().backward()
        local.append((e.weight.grad.to_dense(), h.weight.grad.clone()))
    opt.zero_grad()
    head(emb(idx[rank])).sum().backward()
    opt.synchronize()
    what = f"sparse (sparse_as_dense={sparse_as_dense})"
    assert emb.weight.grad.is_sparse, what
    close(emb.weight.grad.to_dense(), sum(l[0] for l in local) / world, 1e-6, what)
    close(head.weight.grad, sum(l[1] for l in local) / world, 1e-6, what + " dense parameter")
    before = emb.weight.detach().clone()
    with opt.skip_synchronize():
        opt.step()  # SGD applies the sparse gradient
    close(emb.weight.detach(), before - 0.1 * sum(l[0] for l in local) / world, 1e-6, what + " step")
    opt._remove_hooks()


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    try:
        check_sparse(hvd.rank(), hvd.size(), sparse_as_dense=False)
        check_sparse(hvd.rank(), hvd.size(), sparse_as_dense=True)
    except AssertionError as e:
        print(f"FAIL on rank {hvd.rank()} ({hvd.backend()}): {e}", flush=True)
        sys.exit(1)
    print(f"sparse_check: OK on rank {hvd.rank()} of {hvd.size()} ({hvd.backend()})")
    hvd.shutdown()
