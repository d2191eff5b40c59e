#!/usr/bin/env bash
# On the GPU machine, from the repository root: unpacks the carried .peers/site.txz (gdn and the
# peers installed by bench/peers_stage.sh) into /tmp/site and /tmp/site-lib, then runs
# bench/peers.py with the arguments given (none: unpack only). Triton's and TileLang's kernel
# caches live in /tmp/kernel-cache/{triton,tilelang}, seeded from carried .peers/<name>.tgz.* and
# written back as $OUT/<name>.tgz.* (15 MB pieces: $OUT's files come back up to 16 MiB each), so
# that a later machine skips the peers' compilation and autotuning (TileLang's took 490 s on a
# fresh H200, Triton's 450 s); GDN_PEERS_TIMEOUT=S stops peers.py after S seconds, so that the
# caches still come back; GDN_PEERS_RUNNER runs peers.py under a command (ncu for `--part profile`).
# site.txz (45 MB) and the TileLang cache (4 MB) fit one call's 64 MiB carry, Triton's (22 MB)
# does not: carry those two with `--peers gdn,flashqla,transformers`, then, while the machine is
# warm (/tmp stays), .peers/triton.tgz.* alone with `--peers fla`.
# Two runs in one call (say mixed and long gates) each write peers.log: give each its own OUT,
# `OUT=$OUT/mixed bash bench/gpu_peers.sh ... --gates mixed; OUT=$OUT/long ... --gates long`.
set -uo pipefail
out="${OUT:-$PWD/gpu-logs}"
mkdir -p "$out" /tmp/kernel-cache
[ -f .peers/site.txz ] && rm -rf /tmp/site /tmp/site-lib && tar -xJf .peers/site.txz -C /tmp &&
  echo "gpu_peers: unpacked .peers/site.txz"
for name in triton tilelang; do
  ls .peers/$name.tgz.* >/dev/null 2>&1 && cat .peers/$name.tgz.* | tar -xzf - -C /tmp/kernel-cache
done
export LD_LIBRARY_PATH="/tmp/site-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH=/tmp/site \
  TRITON_CACHE_DIR=/tmp/kernel-cache/triton TILELANG_CACHE_DIR=/tmp/kernel-cache/tilelang \
  PYTHONUNBUFFERED=1
# The card's state before and after, in the log: a peer once ran 1.05-1.56x slower on one H100
# than on every other while gdn's times held (RESULTS.md, forty-fourth session), unexplained.
card_state() {
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.sm,clocks.mem,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader | sed "s/^/gpu_peers: $1: /"
}
if [ $# -gt 0 ]; then
  card_state before | tee "$out/peers.log"
  timeout "${GDN_PEERS_TIMEOUT:-0}" ${GDN_PEERS_RUNNER:-} python3 bench/peers.py "$@" 2>&1 |
    tee -a "$out/peers.log"
  card_state after | tee -a "$out/peers.log"
fi
for name in triton tilelang; do
  [ -d /tmp/kernel-cache/$name ] &&
    tar -czf - -C /tmp/kernel-cache $name | split -b 15M - "$out/$name.tgz."
done
du -sh /tmp/kernel-cache/* 2>/dev/null
