#!/usr/bin/env bash
# scripts/k8s/*.yaml parse with the Kubeflow operators' own Python models (k8s_manifest_check.py),
# and a manifest with a misspelt field does not (the check can fail). Skips (77) without .venv-kubeflow.
set -uo pipefail
src=$1
py=$src/.venv-kubeflow/bin/python
[ -x "$py" ] || { echo "SKIP: $py missing; run scripts/install_deps.sh"; exit 77; }
"$py" "$src/tests/reference/k8s_manifest_check.py" "$src"/scripts/k8s/*.yaml || exit 1
bad=$(mktemp --suffix .yaml)
trap 'rm -f "$bad"' EXIT
sed 's/nprocPerNode/nProcPerNode/' "$src/scripts/k8s/pytorchjob.yaml" > "$bad"
if "$py" "$src/tests/reference/k8s_manifest_check.py" "$bad"; then
  echo "a PyTorchJob with the misspelt field nProcPerNode passed the check" >&2
  exit 1
fi
echo "the misspelt manifest was refused, as it should be"
