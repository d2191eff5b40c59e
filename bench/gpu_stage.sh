#!/usr/bin/env bash
# Builds the GPU programs here (sm_90a, no MPI) and stages them with the shared libraries they
# need in .device/, for a machine that has the GPU but not this build (bench/gpu_check.sh runs
# them there). gdn's wheel goes in .whl/ (pip wheel . -w .whl), to be packed with the peers' by
# bench/peers_stage.sh.
#
#   bash bench/gpu_stage.sh                 # this tree's programs
#   bash bench/gpu_stage.sh --base main     # also bench_cuda of another commit, in .device/base/,
#                                           # for `gpu_check.sh ab` (the two timed in turns)
#   bash bench/gpu_stage.sh --commit old v2 # bench_cuda of commit v2 in .device/old/ (repeatable;
#                                           # --base C is --commit base C)
#   bash bench/gpu_stage.sh --patch chain bench/variants/chain-trim.patch
#                                           # bench_cuda of HEAD with this patch applied (or
#                                           # several, FILE,FILE), in .device/chain/ (repeatable;
#                                           # bench/variants/README.md)
#   bash bench/gpu_stage.sh --variant v1 -DTRY=1  # also this tree's bench_cuda built with
#                                           # these CUDA flags, in .device/v1/ (repeatable; time
#                                           # with GDN_AB_PROGRAMS="base new v1" gpu_check.sh ab)
#   GDN_VARIANT_TESTS="test_cuda_delta_rule" bash bench/gpu_stage.sh --variant v1 -DTRY=1
#                                           # and these test programs of each variant (and of each
#                                           # --commit and --patch but base), beside it
#
# Last, .device/ is packed into .device.txz (xz: about a tenth of its size, so that many programs
# fit a device call's 64 MiB): carry [".device.txz"] and begin the command with
# `tar -xJf .device.txz &&`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
usage="usage: gpu_stage.sh [--base COMMIT] [--commit NAME COMMIT]... [--patch NAME FILE[,FILE]]...
  [--variant NAME CUDA_FLAGS]..."
commits=()  # name, commit, patch ('' for none): three entries each
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      commits+=(base "$(git rev-parse "$2")" ''); shift 2 ;;
    --commit)
      [ $# -ge 3 ] && [[ "$2" =~ ^[A-Za-z0-9_]+$ ]] || { echo "$usage" >&2; exit 2; }
      commits+=("$2" "$(git rev-parse "$3")" ''); shift 3 ;;
    --patch)
      [ $# -ge 3 ] && [[ "$2" =~ ^[A-Za-z0-9_]+$ ]] || { echo "$usage" >&2; exit 2; }
      IFS=, read -ra files <<<"$3"
      commits+=("$2" "$(git rev-parse HEAD)" "$(realpath "${files[@]}" | paste -sd,)"); shift 3 ;;
    --variant)
      [ $# -ge 3 ] && [[ "$2" =~ ^[A-Za-z0-9_]+$ ]] || { echo "$usage" >&2; exit 2; }
      variants+=("$2" "$3"); shift 3 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
# ccache (installed here if missing) shares the object files that the builds of the other commits
# and patches have in common: each is a full build (in build-gpu-tree/, one after another), and
# most of their files are the same. About 7 minutes for six trees here cold, under 2 warm.
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
command -v ccache >/dev/null ||
  { $sudo apt-get update -qq && $sudo apt-get install -y -qq ccache; } >/dev/null 2>&1 || true
launchers=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR="$PWD/.cache/ccache" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
configure() {  # source dir, build dir, extra cmake arguments
  cmake -S "$1" -B "$2" -G Ninja -DGDN_NATIVE=OFF -DGDN_MPI=OFF -DGDN_BUILD_BENCH=ON \
    ${launchers[@]+"${launchers[@]}"} "${@:3}" >/dev/null
}
configure . build-gpu
tests="test_cuda_delta_rule test_cuda_l2norm test_cuda_wgmma test_cuda_cp test_comm_gpu
  test_cuda_determinism test_cuda_guards"
[ -f build-gpu/build.ninja ] && grep -q "^build tests/test_comm_nccl" build-gpu/build.ninja &&
  tests="$tests test_comm_nccl"
ninja -C build-gpu gdn $tests bench_cuda bench_cuda_cp
rm -rf .device .device.txz && mkdir -p .device
cp build-gpu/gdn $(for t in $tests; do echo build-gpu/tests/$t; done) \
  build-gpu/bench/bench_cuda build-gpu/bench/bench_cuda_cp .device/
for lib in libfmt.so.9 libgomp.so.1; do cp "$(ldconfig -p | awk -v l=$lib '$1 == l {print $NF; exit}')" .device/; done
stage() {  # name, build dir, test programs: its bench_cuda and those in .device/NAME/
  mkdir -p ".device/$1"
  cp "$2/bench/bench_cuda" ".device/$1/"
  for t in $3; do cp "$2/tests/$t" ".device/$1/"; done
}
# Another commit's tree (with patches) in build-gpu-tree/, one after another in the same folder,
# so that ccache (which keys on the paths __FILE__ expands to) finds the files they share.
for ((i = 0; i < ${#commits[@]}; i += 3)); do
  name="${commits[i]}" commit="${commits[i + 1]}" patch="${commits[i + 2]}"
  rm -rf build-gpu-tree && mkdir -p build-gpu-tree/src
  git archive "$commit" | tar -x -C build-gpu-tree/src
  IFS=, read -ra files <<<"$patch"
  applied=""
  for file in "${files[@]}"; do  # the ceiling: inside this checkout, git apply would skip
    # every path as outside the directory, silently
    GIT_CEILING_DIRECTORIES="$PWD/build-gpu-tree" git -C build-gpu-tree/src apply "$file"
    applied+=" + $(basename "$file")"
  done
  configure build-gpu-tree/src build-gpu-tree/build
  tests_here="$([ "$name" = base ] || echo "${GDN_VARIANT_TESTS:-}")"
  # shellcheck disable=SC2086  # a list of targets
  ninja -C build-gpu-tree/build bench_cuda $tests_here
  stage "$name" build-gpu-tree/build "$tests_here"
  echo "$(git rev-parse --short "$commit")$applied" >".device/$name/commit"
done
for ((i = 0; i < ${#variants[@]}; i += 2)); do  # this tree with extra CUDA flags
  name="${variants[i]}" flags="${variants[i + 1]}"
  configure . "build-gpu-$name" -DCMAKE_CUDA_FLAGS="$flags"
  # shellcheck disable=SC2086  # a list of targets
  ninja -C "build-gpu-$name" bench_cuda ${GDN_VARIANT_TESTS:-}
  stage "$name" "build-gpu-$name" "${GDN_VARIANT_TESTS:-}"
  echo "$flags" >".device/$name/flags"
done
tar -cf - .device | xz -T0 -6 >.device.txz
echo "staged: .device $(du -sh .device | cut -f1), .device.txz $(du -sh .device.txz | cut -f1)"
