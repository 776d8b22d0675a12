"""gradcomp.torch.CompressedAdam under mpirun, on the backend GRADCOMP_BACKEND names ("mpi": the C++
compressed_allreduce per parameter; "runtime": the fusion runtime in the optimizer's own scopes): the 1-bit Adam
reference with identical parameters on every rank after every step, the state round trip for a sign, a sparse and a
low-rank codec, and the tiny-variance guard. Exits non-zero on any failure.

    mpirun -np 2 python tests/python/compressed_adam_check.py
"""
import sys

import torch

import gradcomp.torch as hvd
import compressed_adam_checks as checks

hvd.init()
torch.set_num_threads(1)
try:
    checks.check_against_onebit_adam_reference()
    for spec, rule in [("onebit", "adamw"), ("topk:ratio=0.1", "lamb"), ("powersgd:rank=2", "adam")]:
        checks.check_state_round_trip(spec, rule=rule)
    moved = checks.check_tiny_variance_guard()
    assert moved == 0.0, f"rank {hvd.rank()}: with the guard the ignored coordinates moved by {moved}"
except BaseException:
    import traceback
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    import os
    os._exit(1)
if hvd.rank() == 0:
    print(f"compressed_adam_check: backend {hvd.backend()}, {hvd.size()} ranks: ok")
hvd.shutdown()
