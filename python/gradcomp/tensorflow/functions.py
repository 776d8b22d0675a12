"""horovod.tensorflow.functions: broadcast_variables, and Python objects (pickled) broadcast and gathered over the
world communicator."""
import pickle

import numpy as np

from .collectives import _check_set, broadcast_, global_process_set
from .context import _ctx, require_init


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns rank root_rank's values to `variables` (model.variables, optimizer.variables), eagerly or inside a
    tf.function (one py_function for all of them)."""
    return broadcast_(variables, root_rank, process_set=process_set)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Rank root_rank's `obj` (any picklable object) on every rank. Eager only."""
    require_init()
    _check_set(process_set, "broadcast_object")
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if _ctx.rank == root_rank else np.empty(0, np.uint8)
    length = np.array([data.size], np.int64)
    _ctx.comm.broadcast(length.view(np.uint8), root_rank)
    buf = data.copy() if _ctx.rank == root_rank else np.empty(int(length[0]), np.uint8)
    _ctx.comm.broadcast(buf, root_rank)
    return obj if _ctx.rank == root_rank else pickle.loads(buf.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's `obj` (picklable) as a list in rank order. Eager only."""
    require_init()
    _check_set(process_set, "allgather_object")
    data = np.frombuffer(pickle.dumps(obj), np.uint8).copy()
    lengths = np.empty(_ctx.size, np.int64)
    _ctx.comm.allgather(np.array([data.size], np.int64).view(np.uint8), lengths.view(np.uint8))
    recv = np.empty(int(lengths.sum()), np.uint8)
    _ctx.comm.allgatherv(data, [int(n) for n in lengths], recv)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [pickle.loads(recv[offsets[r]:offsets[r + 1]].tobytes()) for r in range(_ctx.size)]
