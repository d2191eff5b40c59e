#!/usr/bin/env bash
# The machine code (SASS) of one CUDA file's kernels, read here without a GPU: each kernel's
# static instruction count, per setmaxnreg region (a warp role) its spills, tensor-core and
# barrier instructions and the source lines holding most instructions, and its largest loops
# with their chain gaps and spans, the instructions from each wgmma wait to the next wgmma and to
# the next product's last wgmma (bench/sass_lines.py).
# Where a kernel issues on most cycles, fewer instructions on its chain is time; this says where
# they are before any device time is spent. nvdisasm comes from the registry's wheel
# (nvidia-cuda-nvdisasm, the CUDA 13 tools), kept in .cache/.
#
#   bash bench/sass_report.sh fused_backward                      # src/cuda/fused_backward.cu
#   bash bench/sass_report.sh -DGDN_TRY_PREFETCH fused_backward bfloat16 --top 20
#
# Arguments starting with -D go to nvcc; the first other one names the file, the next (optional)
# a substring of the kernels' mangled names; --top N how many source lines to list.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
flags=() rest=()
for arg in "$@"; do
  case "$arg" in
    -D*) flags+=("$arg") ;;
    *) rest+=("$arg") ;;
  esac
done
[ ${#rest[@]} -gt 0 ] || { echo "usage: $0 [-DMACRO...] FILE [KERNEL] [--top N]" >&2; exit 2; }
file="src/cuda/${rest[0]}.cu"
tools=.cache/nvdisasm
nvdisasm="$(find "$tools" -name nvdisasm -type f 2>/dev/null | head -1 || true)"
if [ -z "$nvdisasm" ]; then
  mkdir -p "$tools"
  python3 -m pip download --quiet --no-deps --dest "$tools" 'nvidia-cuda-nvdisasm>=13,<14'
  python3 -m zipfile -e "$tools"/nvidia_cuda_nvdisasm-*.whl "$tools"
  nvdisasm="$(find "$tools" -name nvdisasm -type f | head -1)"
  chmod +x "$nvdisasm"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
nvcc -I include -I src -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -lineinfo \
  --generate-code=arch=compute_90a,code=sm_90a ${flags[@]+"${flags[@]}"} -cubin \
  -o "$work/out.cubin" "$file"
"$nvdisasm" -g -c "$work/out.cubin" >"$work/out.sass"
python3 bench/sass_lines.py "$work/out.sass" "${rest[@]:1}"
