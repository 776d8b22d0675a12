"""horovod.torch.functions' names, for scripts that import them from there: broadcast of parameters, optimizer
state and objects, allgather of objects (objects.py)."""
from .objects import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
