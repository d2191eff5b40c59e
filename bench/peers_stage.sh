#!/usr/bin/env bash
# Here, before the device call that times the peers: their wheels (fetched into .peers/wheels with
# pip download --no-deps) and gdn's (.whl/, `pip wheel . -w .whl`, with the shared libraries it
# needs copied into .whl/lib) installed with this machine's Python 3.12, the GPU machine's, into
# one folder, packed into .peers/site.txz (xz: about 45 MB where the wheels take 85), so that one
# call carries them all; bench/gpu_peers.sh unpacks it into /tmp/site and /tmp/site-lib.
#
#   bash bench/peers_stage.sh    # then a device call: carry [".peers/site.txz"] (and the kernel
#                                # caches .peers/<name>.tgz.* once kept), run
#                                # GDN_PEERS_TIMEOUT=540 bash bench/gpu_peers.sh --part speed
set -euo pipefail
cd "$(dirname "$0")/.."
python="${GDN_PYTHON312:-$HOME/.pyenv/versions/3.12.1/bin/python3}"
"$python" -m pip download -q --no-deps --dest .peers/wheels 'fla-core==0.6.0' 'flash-qla==0.1.3' \
  'tilelang==0.1.15' 'apache-tvm-ffi==0.1.12' 'torch-c-dlpack-ext==0.1.5' 'z3-solver==4.15.4.0'
ls .whl/*.whl >/dev/null
# The Debian libraries gdn's module links that the GPU machine lacks (its CUDA and NCCL it has).
mkdir -p .whl/lib
for lib in libfmt.so.9 libgomp.so.1; do cp -L "/usr/lib/x86_64-linux-gnu/$lib" .whl/lib/; done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile \
  --target "$work/site" .peers/wheels/*.whl .whl/*.whl
cp -r .whl/lib "$work/site-lib"
tar -C "$work" -cf - site site-lib | xz -T0 -9 >.peers/site.txz
wheels=(.peers/wheels/*.whl .whl/*.whl)
echo "peers_stage: .peers/site.txz $(du -sh .peers/site.txz | cut -f1) (${#wheels[@]} wheels)"
