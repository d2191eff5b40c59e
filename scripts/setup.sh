#!/usr/bin/env bash
# Installs gdn's build dependencies from Debian's packages, skipping those already installed.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libeigen3-dev nlohmann-json3-dev
  libfmt-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin
  python3-dev python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
echo "gdn: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
