"""Runs a TensorFlow test script on N ranks with the TensorFlow venv's interpreter (scripts/tf-deps.sh makes
.venv-tf; GRADCOMP_TF_PYTHON names another): under mpirun, or under gradcomprun with the given flags. Exits 77
(CTest: skipped) with the reason when no interpreter with TensorFlow and Keras 3 is there.

    tf_launch.py --np 2 SCRIPT [ARGS...]
    tf_launch.py --gradcomprun "-np 2 -H localhost:2" SCRIPT [ARGS...]
"""
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tf_python():
    py = os.environ.get("GRADCOMP_TF_PYTHON") or os.path.join(ROOT, ".venv-tf", "bin", "python")
    if not os.path.exists(py):
        return None, f"no TensorFlow interpreter at {py} (run scripts/tf-deps.sh or set GRADCOMP_TF_PYTHON)"
    r = subprocess.run([py, "-c", "import tensorflow, keras; assert keras.__version__ >= '3'"], capture_output=True,
                       text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if r.returncode != 0:
        return None, f"{py} cannot import TensorFlow with Keras 3: {r.stderr.strip().splitlines()[-1:]}"
    return py, None


def main(argv):
    py, why = tf_python()
    if py is None:
        print(f"SKIPPED: {why}", flush=True)
        return 77
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if argv[0] == "--np":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", argv[1], "-x", "PYTHONPATH", "-x",
               "OMP_NUM_THREADS", "-x", "GRADCOMP_BACKEND", "-x", "TF_CPP_MIN_LOG_LEVEL", py] + argv[2:]
    elif argv[0] == "--gradcomprun":
        cmd = [py, "-m", "gradcomp.run"] + shlex.split(argv[1]) + [py] + argv[2:]
    else:
        raise SystemExit(__doc__)
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
