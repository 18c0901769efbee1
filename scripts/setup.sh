#!/bin/bash
# Sets up a fresh Debian 12 machine (as root) to build, run and test warren:
# system packages, the release build (build/), the Python venv (.venv) with
# the SDK and pytest, the base rootfs for the base layer, and the rootfs dirs
# of the eval layers (toolset/python@1, workspace/more-itertools@10.1.0;
# downloaded here, never at test or run time). Idempotent:
# re-running only does what is missing or out of date.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [[ $EUID -ne 0 ]]; then
  echo "$0: must run as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive

pkgs=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libseccomp-dev libarchive-dev libspdlog-dev libcli11-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libcap-dev libssl-dev
  erofs-utils debootstrap attr iproute2 util-linux procps busybox-static
  libcpp-httplib-dev
  libcurl4-openssl-dev  # registry pulls (image/oci)
  docker-registry skopeo umoci  # image tests: a loopback registry, pushes, the reference unpack
  nftables libnftables-dev libmnl-dev  # sandbox network (src/net): nft for tests, the libraries warrend links
  prometheus-cpp-dev  # warrend --metrics-listen: /metrics (src/metrics)
  libpng-dev  # screenshots of an X server inside a sandbox (src/runtime/desktop)
  # the toolset/desktop layer's contents (scripts/build-toolset-desktop-rootfs.sh)
  xvfb xdotool matchbox-window-manager xterm dillo xfonts-base
  lxcfs  # sandboxes' /proc views of their own cpus and memory (jail/lxcfs.h)
  qemu-system-x86 cpio e2fsprogs  # the microvm backend: QEMU, the guest initramfs (scripts/microvm), mke2fs
  qemu-utils  # the vm backend: qemu-img (each VM's copy-on-write disk)
  openssl  # image tests: a TLS registry with its own CA
  etcd-server etcd-client  # cluster membership (src/cluster); its tests start their own etcd
  glusterfs-server glusterfs-client  # image tests: a shared layer store on a one-node GlusterFS volume (FUSE)
  clang-format-15 clang-tidy-15
  gcc-multilib
  # fncall's and /run_code's languages beyond python/bash/C/C++: the toolset
  # layers' contents (scripts/build-toolset-rootfs.sh copies these packages)
  openjdk-17-jdk-headless golang-1.19-go rustc nodejs
  python3-numpy python3-scipy python3-pandas python3-sympy python3-networkx
  python3 python3-venv python3-pip
  python3-pytest patch make curl ca-certificates
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

echo "setup: building (release preset)"
cmake --preset release
cmake --build build -j2

echo "setup: microvm guest kernel and initramfs (/var/cache/warren/microvm)"
scripts/microvm/build-guest.sh --agent build/src/guest/agent/warren-agent --out /var/cache/warren/microvm

echo "setup: Python venv"
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3)
if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c 'import sys' 2>/dev/null; then
  rm -rf .venv
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e sdk/python "pytest>=7" "pytest-timeout>=2" "ruff==0.17.6" "mypy==2.4.1" \
  "prometheus-client==0.21.1"  # tests/integration/test_metrics.py parses /metrics with it
# The E2B SDK the E2B front end is tested against (tests/integration/test_e2b.py).
.venv/bin/python -m pip install -q "e2b==2.63.0"
# The SandboxFusion client and verl's reward code /run_code is tested against
# (tests/integration/test_sandbox_fusion_client.py, bench/sandbox_fusion_c64.py).
# verl without its dependencies (torch, ray, ...): the test loads only its
# sandbox_fusion utils module (stdlib + requests) by file.
.venv/bin/python -m pip install -q "sandbox-fusion==0.3.7"
.venv/bin/python -m pip install -q --no-deps "verl==0.9.1"

echo "setup: harness venv (.venv-harness: Harbor and NeMo-Gym need Python >= 3.12)"
# The SDK and the pinned harnesses its providers are tested against
# (tests/integration/test_providers_{harbor,nemogym}.py, and Harbor's own E2B
# environment on the e2b SDK in test_e2b_harbor.py; the pins are also in
# tests/integration/harness_venv.py). The newest Python >= 3.12 on PATH or
# in pyenv; none: the provider tests skip, saying so.
# (pyenv's shims exist for versions that are not active: each candidate must run.)
hpy=
for c in $(command -v python3.13 python3.12 || true) \
  $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9].*/bin/python 2>/dev/null | sort -rV || true); do
  if "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then hpy=$c; break; fi
done
if [[ -n $hpy ]]; then
  if [[ ! -x .venv-harness/bin/python ]] || ! .venv-harness/bin/python -c 'import sys' 2>/dev/null; then
    rm -rf .venv-harness
    "$hpy" -m venv .venv-harness
  fi
  .venv-harness/bin/python -m pip install -q --upgrade pip
  .venv-harness/bin/python -m pip install -q -e sdk/python "harbor==0.26.0" "omegaconf==2.4.0" \
    "e2b==2.63.0" "dockerfile-parse==2.0.1"
  # nemo-gym 0.5+ declares Requires-Python >= 3.13.14 (newer than this machine's
  # Pythons) and pulls ray, mlflow, vllm, ... for its servers; its sandbox API
  # (all the provider uses) runs here with omegaconf and pydantic.
  .venv-harness/bin/python -m pip install -q --no-deps --ignore-requires-python "nemo-gym==0.7.0"
else
  echo "setup: no Python >= 3.12 found: the Harbor and NeMo-Gym provider tests will skip"
fi

echo "setup: base rootfs"
scripts/build-base-rootfs.sh /var/cache/warren/rootfs/debian-12

# The vm backend's desktop guest (a full Debian with systemd and X: a
# system layer over the base rootfs, ~750 MB; see scripts/vm/build-guest.sh):
# built by default, so that CI
# runs tests/integration/test_vm.py; WARREN_SETUP_VM=0 skips it (test_vm.py
# then skips with the reason). Kept current at every run: its guest agent
# must speak this tree's protocol (only the disk is redone when just the
# agent changed).
if [[ ${WARREN_SETUP_VM:-1} != 0 ]]; then
  echo "setup: vm desktop guest (/var/cache/warren/vm)"
  scripts/vm/build-guest.sh --agent build/src/guest/agent/warren-agent --out /var/cache/warren/vm \
    --base /var/cache/warren/rootfs/debian-12
else
  echo "setup: vm desktop guest skipped (WARREN_SETUP_VM=0)"
fi

echo "setup: gcc toolset rootfs (fncall's C/C++ calls; from the host's Debian 12 packages)"
[[ -d /var/cache/warren/rootfs/toolset-gcc ]] ||
  scripts/build-toolset-gcc-rootfs.sh /var/cache/warren/rootfs/toolset-gcc /var/cache/warren/rootfs/debian-12

# The toolsets of SandboxFusion's common languages, for fncall and /run_code
# (warrend --fncall-layers base/debian-12,toolset/gcc,toolset/jdk,...; README
# "fncall"). Times and sizes measured on the 2-core dev machine (packages
# already installed; bench/RESULTS.md): jdk 13 s / 285M, go 17 s / 474M,
# rust 22 s / 427M (stacked over toolset/gcc), node 12 s / 199M, python-sci
# 102 s / 301M (most of it compiling byte code). Each is redone only when
# its package list changes.
echo "setup: toolset rootfs dirs (java, go, rust, nodejs, scientific python)"
R=/var/cache/warren/rootfs
scripts/build-toolset-rootfs.sh $R/toolset-jdk $R/debian-12 openjdk-17-jdk-headless
scripts/build-toolset-rootfs.sh $R/toolset-go $R/debian-12 golang-1.19-go
scripts/build-toolset-rootfs.sh $R/toolset-rust $R/debian-12 --minus "g++ gcc make" rustc
scripts/build-toolset-rootfs.sh $R/toolset-node $R/debian-12 nodejs
# --skip: scipy depends on python3-pythran (its build-time compiler: g++,
# boost, python3-dev), which depends on numpy: leaving pythran's closure out
# with --minus took numpy out too.
scripts/build-toolset-rootfs.sh $R/toolset-python-sci $R/debian-12 --skip python3-pythran \
  python3-numpy python3-scipy python3-pandas python3-sympy python3-networkx

echo "setup: eval layers' rootfs dirs (warren eval; scripts/demo.sh)"
scripts/build-toolset-python-rootfs.sh /var/cache/warren/rootfs/toolset-python \
  /var/cache/warren/rootfs/debian-12
echo "setup: desktop toolset rootfs (Xvfb, xdotool, matchbox, xterm, dillo: the desktop API on containers and microVMs)"
scripts/build-toolset-desktop-rootfs.sh $R/toolset-desktop $R/debian-12
# more-itertools 10.1.0's sdist from PyPI, pinned by sha256.
scripts/build-workspace-rootfs.sh /var/cache/warren/rootfs/workspace-more-itertools-10.1.0 \
  more-itertools 10.1.0 626c369fa0eb37bac0291bce8259b332fd59ac792fa5497b59837309cd5b114a

echo "setup: done"
