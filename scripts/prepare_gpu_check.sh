#!/usr/bin/env bash
# Prepares, on this (Debian 12, networked) machine, everything scripts/gpu_check.sh needs on a GPU
# machine that has PyTorch (with LibTorch and NCCL), CMake, ninja and a C++ compiler but no
# Debian packages and no network:
#   .deps/gpu_check/debs/   the Debian packages we build and link against (CLI11, nlohmann-json,
#                           spdlog, fmt, sentencepiece, GoogleTest, protobuf, Boost's headers,
#                           PCRE2, utf8proc, xxHash, Open MPI, pkg-config) and the runtime
#                           libraries they load, fetched with `apt-get download` (~24 MB);
#                           `gpu_check.sh --dry-run` checks that every header a local build read
#                           from /usr comes from one of them or from the compiler's base set;
#                           gpu_check.sh unpacks them with `dpkg -x` into a private prefix
#   .deps/gpu_check/data/   the LLaMA-2 tokenizer and Alpaca-format data cut to full 2048-token
#                           sequences (JSON for alpaca-train, a tensor file for PyTorch)
# .deps/ is git-ignored; carry it to the GPU machine (it is well under the 64 MiB a run may carry).
#
#   bash scripts/prepare_gpu_check.sh            # idempotent; re-downloads nothing already there
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.deps/gpu_check
mkdir -p "$DEST/debs" "$DEST/data"

# Build-time packages, then every shared library they (Open MPI above all) load at run time that
# a stock Ubuntu/Debian image with CUDA does not carry. libc, libstdc++, zlib, libudev, OpenSSL
# are assumed present (they are in every image that runs PyTorch).
PACKAGES=(
  libcli11-dev nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libsentencepiece-dev libsentencepiece0 libgtest-dev libgmock-dev
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32 libboost1.74-dev
  libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 libxxhash-dev libxxhash0 libyaml-dev libyaml-0-2
  pkgconf pkgconf-bin libpkgconf3
  libopenmpi-dev libopenmpi3 openmpi-common openmpi-bin
  libpmix2 libhwloc15 libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2
  libpsm-infinipath1 libmunge2 libnuma1 libltdl7 libpciaccess0 libxnvctrl0
)
missing=()
for p in "${PACKAGES[@]}"; do
  ls "$DEST/debs/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[prepare] apt-get download ${#missing[@]} packages into $DEST/debs"
  (cd "$DEST/debs" && apt-get download "${missing[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
fi
for p in "${PACKAGES[@]}"; do
  ls "$DEST/debs/${p}_"*.deb >/dev/null 2>&1 || { echo "[prepare] failed to download $p" >&2; exit 1; }
done
printf '%s\n' "${PACKAGES[@]}" > "$DEST/debs/PACKAGES"

PY=.venv/bin/python
[[ -x $PY ]] || PY=python3
SHARED=${ALPACA_SHARED_DIR:-$(cd .. && pwd)/shared}
"$PY" bench/gpu_bench.py prepare --out "$DEST/data" --shared "$SHARED"
# The CPU benchmark's inputs (bench/bench.py reads them from ALPACA_SHARED_DIR/data): gpu_check.sh
# runs it when the GPU machine's CPU has AMX, the CPU the bf16 speed goals are stated for.
mkdir -p "$DEST/cpu_bench/data/alpaca" "$DEST/cpu_bench/data/llama2-tokenizer"
cp "$SHARED/data/alpaca/alpaca_5000.json" "$DEST/cpu_bench/data/alpaca/"
cp "$SHARED/data/llama2-tokenizer/tokenizer.model" "$DEST/cpu_bench/data/llama2-tokenizer/"

du -sh "$DEST" | awk '{print "[prepare] " $2 " holds " $1}'
echo "[prepare] done. On the GPU machine: bash scripts/gpu_check.sh   (carry .deps/gpu_check)"
