"""gradcomprun --check-build: what this installation of gradcomp has, in horovodrun --check-build's layout."""
import importlib.util
import shutil


def _has(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def report():
    """The text printed by --check-build."""
    import gradcomp
    from gradcomp import _gradcomp as C

    def box(flag):
        return "[X]" if flag else "[ ]"

    mpi = bool(C.has_collectives)
    gloo = _has("torch")
    lines = [f"gradcomp v{gradcomp.__version__}:", "", "Available Frameworks:",
             f"    {box(_has('tensorflow'))} TensorFlow", f"    {box(_has('torch'))} PyTorch",
             f"    {box(_has('tensorflow') and _has('keras'))} Keras", "", "Available Controllers:",
             f"    {box(mpi and shutil.which('mpirun') is not None)} MPI", f"    {box(gloo)} Gloo", "",
             "Available Tensor Operations:", f"    {box(bool(C.has_nccl))} NCCL", f"    {box(bool(C.has_nccl))} CUDA",
             f"    {box(mpi)} MPI", f"    {box(gloo)} Gloo", f"    {box(bool(C.has_runtime))} Fusion runtime", "",
             "Compressors:", "    " + ", ".join(c["name"] for c in gradcomp.list_compressors())]
    return "\n".join(lines)
