#!/usr/bin/env bash
# The sbatch scripts in scripts/slurm/ are copied one at a time, so each carries the whole
# signal / requeue section (4.); this keeps the copies identical and every script valid bash.
set -euo pipefail
dir=$1
first=""
n=0
for f in "$dir"/*.sbatch; do
  bash -n "$f"
  grep -q '^#SBATCH --signal=B:USR1@' "$f" || { echo "$f: no #SBATCH --signal=B:USR1@..." >&2; exit 1; }
  grep -q '^#SBATCH --requeue' "$f" || { echo "$f: no #SBATCH --requeue" >&2; exit 1; }
  grep -q '^#SBATCH --open-mode=append' "$f" || { echo "$f: no #SBATCH --open-mode=append" >&2; exit 1; }
  section=$(sed -n '/^# ---- 4\. /,$p' "$f")
  [ -n "$section" ] || { echo "$f: no section 4" >&2; exit 1; }
  if [ -z "$first" ]; then
    first=$section ref=$f
  elif [ "$section" != "$first" ]; then
    echo "$f: section 4 differs from $ref's; keep them the same:" >&2
    diff <(echo "$first") <(echo "$section") >&2 || true
    exit 1
  fi
  n=$((n + 1))
done
[ "$n" -ge 3 ] || { echo "expected at least 3 scripts in $dir, found $n" >&2; exit 1; }
echo "$n scripts, one shared section"
