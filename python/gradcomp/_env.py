"""Reading the launcher's environment (shared by gradcomp.torch and gradcomp.tensorflow)."""
import contextlib
import os


def env_int(*names, default=None):
    """The integer value of the first of `names` set (and not empty) in the environment, else `default`."""
    for n in names:
        v = os.environ.get(n)
        if v is not None and v != "":
            return int(v)
    return default


@contextlib.contextmanager
def environ_scope(values, unset=()):
    """Within the block, the environment has `values` set and the names in `unset` removed; on leaving (also by an
    exception) every name touched gets its former value back, or is removed again if it had none."""
    saved = {k: os.environ.get(k) for k in list(values) + list(unset)}
    for k in unset:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
