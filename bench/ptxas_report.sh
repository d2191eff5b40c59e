#!/usr/bin/env bash
# Registers and spills of every CUDA kernel, per ptxas (sm_90a, as the build compiles them), so
# that a kernel change's register cost is read here before any device time is spent on it: at
# 255 registers a thread grad_chunk's speed follows its spills (bench/RESULTS.md, twenty-second
# session), and a kernel whose wgmma ptxas serialized for lack of registers (C7512: each waits
# for the one before) is marked SERIALIZED (the fused backward's first version ran 1.5x slow so).
# Extra arguments go to nvcc, e.g. a variant's macros:
#
#   bash bench/ptxas_report.sh                      # this tree
#   bash bench/ptxas_report.sh -DTRY=1 grad_chunk   # one file (src/cuda/NAME.cu), with a macro
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
flags=() files=()
for arg in "$@"; do
  case "$arg" in
    -*) flags+=("$arg") ;;
    *) files+=("src/cuda/$arg.cu") ;;
  esac
done
[ ${#files[@]} -gt 0 ] || files=(src/cuda/*.cu)
printf '%-44s %9s %12s %11s  %s\n' kernel registers 'spill stores' 'spill loads' \
  'wgmma (ptxas C7512: serialized for lack of registers)'
for file in "${files[@]}"; do
  nvcc -I include -I src -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr \
    --generate-code=arch=compute_90a,code=sm_90a -Xptxas -v "${flags[@]}" -c "$file" \
    -o /dev/null 2>&1 |
    awk '
      /Compiling entry function/ {
        match($0, /_Z[^'"'"']*/); mangled = substr($0, RSTART, RLENGTH); name = mangled
        cmd = "c++filt " name; cmd | getline name; close(cmd)
        gsub(/gdn::cuda::\(anonymous namespace\)::/, "", name)
        sub(/^void /, "", name); sub(/\([^(]*\)$/, "", name)
        gsub(/\(gdn::cuda::Pass\)/, "pass ", name); gsub(/__nv_bfloat16/, "bf16", name)
        gsub(/__half/, "f16", name); gsub(/\(gdn::cuda::Fold\)/, "fold ", name)
      }
      /C7512/ { match($0, /_Z[^'"'"']*/); serialized[substr($0, RSTART, RLENGTH)] = 1 }
      /spill stores/ { stores = $5; loads = $9 }
      /Used [0-9]+ registers/ {
        match($0, /Used [0-9]+/); regs = substr($0, RSTART + 5, RLENGTH - 5)
        order[++n] = mangled
        row[mangled] = sprintf("%-44s %9d %12d %11d", name, regs, stores, loads)
      }
      END {
        for (i = 1; i <= n; ++i)
          print row[order[i]] (order[i] in serialized ? "  SERIALIZED" : "")
      }'
done
