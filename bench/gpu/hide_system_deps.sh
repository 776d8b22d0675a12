#!/usr/bin/env bash
# Runs a command (check.sh --dry-run) in a private mount namespace (unshare -m, as root) in which this machine's own
# copies of what bench/gpu/prepare.sh carries are out of reach, as on the GPU machine, whose image has none of them:
#   - fmt, GoogleTest/GoogleMock and Google Benchmark headers, CMake package files and static libraries;
#   - the OpenBLAS/CBLAS headers and CMake-visible development files;
#   - all of Open MPI and PMIx (headers, wrappers, mpirun/orted, libraries, plugins, configuration);
#   - NCCL in the CUDA toolkit and /usr/local: its headers and library are shown instead in a folder shaped like the
#     nvidia-nccl-cu13 wheel (nvidia/nccl/{include,lib}) on PYTHONPATH, which is where check.sh looks.
# Hidden files read as empty (/dev/null is mounted over them), hidden folders as empty folders. Runtime copies that this
# machine's own PyTorch loads (libfmt.so.9, libopenblas.so.0) stay: check.sh proves from the build itself
# (CMakeCache paths, compiler dependency files, the loader's resolution) that gradcomp used the prefix's.
#
# usage: bench/gpu/hide_system_deps.sh COMMAND [ARGS...]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
if [ -z "${GRADCOMP_HIDDEN_NS:-}" ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null 2>&1; then
    echo "hide_system_deps.sh: needs root and unshare (a private mount namespace) to hide the system's packages" >&2
    exit 4
  fi
  exec env GRADCOMP_HIDDEN_NS=1 unshare -m --propagation private "$0" "$@"
fi

L=/usr/lib/x86_64-linux-gnu
stash=/tmp/gradcomp-hidden  # a fixed place: a rebuild's CMake cache keeps pointing at the stand-in wheel
rm -rf "$stash"
mkdir -p "$stash/empty" "$stash/site/nvidia/nccl/include" "$stash/site/nvidia/nccl/lib"
hidden=()
hide() {  # path...: folders become empty, files (their targets) read as /dev/null
  for path in "$@"; do
    [ -e "$path" ] || continue
    local real
    real=$(realpath "$path")
    if [ -d "$real" ]; then
      mount --bind "$stash/empty" "$real"
    else
      mount --bind /dev/null "$real"
    fi
    hidden+=("$path")
  done
}

# NCCL: the toolkit's copy becomes the stand-in wheel, then goes out of reach.
for dir in /usr/local/cuda/include /usr/local/include; do
  for item in "$dir"/nccl*.h; do
    [ -e "$item" ] && [ ! -e "$stash/site/nvidia/nccl/include/$(basename "$item")" ] &&
      cp "$item" "$stash/site/nvidia/nccl/include/"
  done
  [ -d "$dir/nccl_device" ] && [ ! -e "$stash/site/nvidia/nccl/include/nccl_device" ] &&
    cp -r "$dir/nccl_device" "$stash/site/nvidia/nccl/include/"
done
nccl_lib=$(find /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/local/lib -maxdepth 1 -name 'libnccl.so.2*' -type f \
             2>/dev/null | head -1 || true)
if [ -n "$nccl_lib" ]; then
  touch "$stash/site/nvidia/nccl/lib/libnccl.so.2"
  mount --bind "$nccl_lib" "$stash/site/nvidia/nccl/lib/libnccl.so.2"
fi
hide /usr/local/cuda/include/nccl.h /usr/local/cuda/include/nccl_device.h /usr/local/cuda/include/nccl_device \
     /usr/local/include/nccl.h /usr/local/include/nccl_device.h /usr/local/include/nccl_device
for lib in /usr/local/cuda/lib/libnccl* /usr/local/cuda/lib64/libnccl* /usr/local/lib/libnccl*; do hide "$lib"; done

hide /usr/include/fmt /usr/include/gtest /usr/include/gmock /usr/include/benchmark \
     "$L/cmake/fmt" "$L/cmake/GTest" "$L/cmake/benchmark" \
     "$L"/libgtest*.a "$L"/libgmock*.a "$L"/libbenchmark*.a "$L"/libbenchmark.so* \
     /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/x86_64-linux-gnu/cblas*.h \
     /usr/include/x86_64-linux-gnu/f77blas.h /usr/include/cblas.h "$L/cmake/openblas" "$L/pkgconfig/openblas.pc" \
     "$L/pkgconfig/blas.pc" \
     "$L/openmpi" "$L/pmix2" /usr/share/openmpi /usr/share/pmix /etc/openmpi /usr/include/x86_64-linux-gnu/mpi \
     "$L"/libmpi*.so* "$L"/libopen-pal.so* "$L"/libopen-rte.so* "$L"/libpmix.so* "$L"/liboshmem.so* \
     /usr/bin/mpicc /usr/bin/mpicxx /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted \
     /usr/bin/opal_wrapper
echo "[hidden] ${#hidden[@]} system paths out of reach (fmt, GoogleTest/GoogleMock, Google Benchmark, OpenBLAS headers," \
     "Open MPI, PMIx, NCCL); NCCL shown as a wheel at $stash/site/nvidia/nccl"
export GRADCOMP_HIDDEN_PATHS="${hidden[*]}"
export PYTHONPATH="$stash/site${PYTHONPATH:+:$PYTHONPATH}"
# The loader finds NCCL where the wheel keeps it, as torch does on the device image (the hidden system copies are
# empty files, which a torch built for CUDA 13 would otherwise load from the CUDA directory and fail on).
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$stash/site/nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$@"
