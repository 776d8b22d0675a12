"""A rank killed or stopped in the middle of a DDP hook exchange (torch backend, 2 gloo ranks, 3 s process-group
timeout): the survivor's backward raises gradcomp.CommError (peer gone) or gradcomp.Timeout (peer stopped) within
the timeout plus a margin, never hangs and never aborts. The victim enters the exchange (the agreement check
passes) and dies or stops inside the codec's collective."""
import json
import multiprocessing
import os
import signal
import tempfile
import time

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import helpers

TIMEOUT_S = 3
MARGIN_S = 12  # gloo's own detection, thread hand-offs and a loaded 2-core machine


def _rank(rank, url, fault, report):
    import datetime
    import torch.distributed as dist
    import gradcomp
    import gradcomp.torch as hvd
    from gradcomp.torch import exchange as _torch_comm
    helpers.watchdog(60)
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    if rank == 1:
        def victim(self, t, op, timeout_s):
            if fault == "kill":
                os._exit(9)
            os.kill(os.getpid(), signal.SIGSTOP)
        _torch_comm.ProcessGroupAdapter.allreduce = victim  # fp16's dense sum is the exchange's first allreduce
    model = helpers.make_model()
    ddp = DDP(model)
    state, hook = hvd.ddp_comm_hook("fp16", model=model)
    ddp.register_comm_hook(state, hook)
    start = time.monotonic()
    result = {"error": None}
    try:
        helpers.loss_of(ddp, helpers.make_batch(0, rank)).backward()
    except Exception as e:  # noqa: BLE001 - reported to the test
        result = {"error": type(e).__name__, "is_gradcomp": isinstance(e, gradcomp.Error), "message": str(e)}
    result["seconds"] = time.monotonic() - start
    with open(report, "w") as f:
        json.dump(result, f)
    os._exit(0)  # the peer is gone: no orderly teardown of the group


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_survivor_raises_within_timeout(fault):
    ctx = multiprocessing.get_context("spawn")
    url = helpers.rendezvous()
    report = os.path.join(tempfile.mkdtemp(), "rank0.json")
    procs = [ctx.Process(target=_rank, args=(r, url, fault, report)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        procs[0].join(TIMEOUT_S + MARGIN_S + 30)
        assert procs[0].exitcode == 0, f"survivor exit code {procs[0].exitcode} (None: it hung)"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    with open(report) as f:
        result = json.load(f)
    expected = {"kill": ("CommError", "Timeout"), "stop": ("Timeout",)}[fault]
    assert result["error"] in expected and result["is_gradcomp"], result
    assert "Unable to cast" not in result["message"], result
    assert result["seconds"] < TIMEOUT_S + MARGIN_S, result
    print(fault, result)
