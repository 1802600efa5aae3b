#!/usr/bin/env bash
# Runs an MPI job on this machine with Open MPI's switches set so it works as root (containers,
# CI) and with more ranks than cores (laptops, 2-core CI boxes), which plain mpirun refuses:
#   scripts/mpirun_local.sh 4 build/alpaca-train --model_name_or_path ... --output_dir out
# The first argument is the number of ranks; the rest is the command. OMP_NUM_THREADS defaults
# to cores / ranks (at least 1) so oversubscribed ranks do not fight over the cores.
set -euo pipefail
if [ $# -lt 2 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 <num_ranks> <program> [args...]" >&2
  exit 2
fi
np=$1
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # Open MPI 4.x refuses root without both
export OMPI_MCA_rmaps_base_oversubscribe=1                       # more ranks than cores (4.x)
export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe      # the same for Open MPI 5 (PRRTE)
export OMPI_MCA_btl_vader_single_copy_mechanism=none             # no CMA in unprivileged containers
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  cores=$(nproc)
  export OMP_NUM_THREADS=$(( cores / np > 0 ? cores / np : 1 ))
fi
extra=()
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  extra=(--oversubscribe)
  [ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
fi
exec mpirun -np "$np" "${extra[@]}" "$@"
