"""Reading the launcher's environment (shared by gradcomp.torch and gradcomp.tensorflow)."""
import os


def env_int(*names, default=None):
    """The integer value of the first of `names` set (and not empty) in the environment, else `default`."""
    for n in names:
        v = os.environ.get(n)
        if v is not None and v != "":
            return int(v)
    return default
