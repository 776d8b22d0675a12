#!/usr/bin/env bash
# Gathers, on this (Debian) machine, what the GPU machine's image lacks for bench/gpu/check.sh: Debian's fmt,
# GoogleTest/GoogleMock, Google Benchmark, OpenBLAS and Open MPI (with the runtime libraries Open MPI needs), fetched
# with `apt-get download` (nothing is installed), unpacked with `dpkg -x` into one prefix, pruned (documentation,
# Fortran bindings, OpenSHMEM, LAPACK, MPI plugins whose libraries are not in the prefix or the base image) and packed
# into DIR/prefix.tar.gz, with DIR/packages.txt listing every package and version. DIR (default .gpu-deps in the
# repository root, ignored by git) is what the device call carries; check.sh unpacks it (docs/cuda.md).
#
# The prefix unpacked is about 56 MiB (OpenBLAS's library alone is 35), too much beside the working tree within the
# 64 MiB one call may carry, so it travels packed: about 17 MiB (2026-12-03, Debian 12 packages).
#
# usage: bench/gpu/prepare.sh [--out DIR] [--help]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR="$ROOT/.gpu-deps"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT_DIR=$(realpath -m "$2"); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "prepare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# What CMake needs to configure and link (headers, CMake package files, libraries) and what the binaries load.
packages=(
  libfmt-dev libfmt9
  libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  libopenblas0-pthread libgfortran5 libquadmath0
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libhwloc15 libudev1 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libmunge2 libnl-3-200 libnl-route-3-200
)
# Libraries every image has (glibc, the GCC runtime, zlib): a plugin needing only these and the prefix's stays.
base_libs="linux-vdso.so.1 libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libstdc++.so.6 libgcc_s.so.1 libz.so.1 ld-linux-x86-64.so.2"

WORK=$(mktemp -d /tmp/gradcomp-prepare.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/debs" "$WORK/prefix"
echo "[prepare] downloading ${#packages[@]} Debian packages into $WORK/debs"
if ! (cd "$WORK/debs" && apt-get download -q "${packages[@]}" >/dev/null 2>"$WORK/apt.log"); then
  echo "[prepare] apt-get download failed (stale package lists?): apt-get update, then again"
  apt-get update -qq
  (cd "$WORK/debs" && apt-get download -q "${packages[@]}" >/dev/null)
fi
: > "$WORK/packages.txt"
for deb in "$WORK"/debs/*.deb; do
  dpkg-deb -x "$deb" "$WORK/prefix"
  printf '%s %s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" "$(stat -c %s "$deb")" \
    >> "$WORK/packages.txt"
done

P="$WORK/prefix/usr"
LIB="$P/lib/x86_64-linux-gnu"
echo "[prepare] pruning"
rm -rf "$P/share/doc" "$P/share/man" "$P/share/lintian" "$P/share/locale" "$P/share/bug" "$P/share/info"
rm -rf "$LIB/fortran" "$LIB"/openblas-pthread/liblapack.so* "$LIB"/libmpi_mpifh* "$LIB"/libmpi_usempi* \
       "$LIB"/liboshmem* "$LIB"/openmpi/include/*.mod "$LIB"/openmpi/lib/*oshmem* "$LIB"/openmpi/lib/libmpi_mpifh* \
       "$LIB"/openmpi/lib/libmpi_usempi* "$P"/bin/*oshmem* "$P"/bin/shmem* "$P"/bin/mpif* "$P"/bin/mpifort*
for plugin in spml sshmem scoll atomic memheap; do rm -f "$LIB"/openmpi/lib/openmpi3/mca_${plugin}_*.so; done
# The links dpkg's alternatives would make (and the unversioned development names).
ln -sf openblas-pthread/libopenblasp-r0.3.21.so "$LIB/libopenblas.so"
ln -sf openblas-pthread/libopenblasp-r0.3.21.so "$LIB/libopenblas.so.0"
for tool in mpirun mpiexec mpicc mpicxx mpic++; do
  [ -e "$P/bin/$tool.openmpi" ] && ln -sf "$tool.openmpi" "$P/bin/$tool"
done
[ -e "$P/bin/mpicc" ] || { echo "[prepare] Open MPI's mpicc is missing from the packages" >&2; exit 1; }

# Plugins (dlopened by Open MPI and PMIx) whose libraries are neither in the prefix nor in every image would print a
# load error per process: drop them (InfiniBand, libfabric, UCX, PSM, CUDA-aware parts, hwloc's X11/OpenCL plugins).
have_lib() {
  case " $base_libs " in *" $1 "*) return 0 ;; esac
  [ -n "$(find "$WORK/prefix" -name "$1" -print -quit)" ]
}
# Open MPI's libmca_common_* helpers go with them (repeated until nothing more goes: a plugin may need a helper).
dropped=0
while :; do
  before=$dropped
  while IFS= read -r -d '' so; do
    for need in $(readelf -d "$so" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      if ! have_lib "$need"; then
        rm -f "$so"
        dropped=$((dropped + 1))
        break
      fi
    done
  done < <(find "$LIB/openmpi/lib/openmpi3" "$LIB/pmix2" "$LIB/hwloc" -name '*.so' -print0 2>/dev/null || true;
           find "$LIB" -maxdepth 1 -name 'libmca_common_*.so*' -type f -print0)
  [ $dropped -eq $before ] && break
done
# Dangling links of what went.
find "$WORK/prefix" -xtype l -delete
# Every library the prefix keeps must find what it needs there or in the base image.
missing=""
while IFS= read -r -d '' so; do
  for need in $(readelf -d "$so" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    have_lib "$need" || missing="$missing $(basename "$so")->$need"
  done
done < <(find "$WORK/prefix" -type f \( -name '*.so' -o -name '*.so.*' \) -print0)
if [ -n "$missing" ]; then
  echo "[prepare] libraries with unmet dependencies:$missing" >&2
  exit 1
fi

mkdir -p "$OUT_DIR"
unpacked=$(du -sb "$WORK/prefix" | cut -f1)
tar -czf "$OUT_DIR/prefix.tar.gz" -C "$WORK" prefix
cp "$WORK/packages.txt" "$OUT_DIR/packages.txt"
packed=$(stat -c %s "$OUT_DIR/prefix.tar.gz")
tree=$(git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 stat -c %s 2>/dev/null) | awk '{s += $1} END {print s + 0}')
echo "[prepare] ${#packages[@]} packages, $dropped plugins dropped; prefix $((unpacked / 1048576)) MiB unpacked," \
     "$((packed / 1048576)) MiB packed in $OUT_DIR/prefix.tar.gz"
echo "[prepare] a call carries the tracked tree ($((tree / 1048576)) MiB) + $((packed / 1048576)) MiB of 64 MiB"
if [ $((tree + packed)) -ge $((56 * 1048576)) ]; then
  echo "[prepare] too large: the tree and the prefix leave less than 8 MiB of the 64 MiB a call carries" >&2
  exit 1
fi
