#!/usr/bin/env bash
# Collective bandwidth of the CPU backends, as a table: gloo (the built-in launcher; on one host
# through shared memory), gloo over its TCP pairs (ALPACA_GLOO_SHM=0), mpi (mpirun) and the old
# store backend (every byte through rank 0's TCPStore), fp32 all_reduce, all_gather
# and reduce_scatter, 2 and 4 ranks. Figures, not a test (docs/distributed.md quotes them).
#
#   scripts/bench_collectives.sh [build dir] [sizes MiB, default 16,64,256] [store sizes, default 16]
#   ALPACA_BENCH_NETNS=1 ...   also 2 nodes x (ranks/2) across network namespaces (root; scripts/netns_testbed.sh)
#
# The store backend moves everything through one process, so it only gets the small sizes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
sizes=${2:-16,64,256}
store_sizes=${3:-16}
worker=$(cd "$build" && pwd)/tests/dist/dist_test_worker
[ -x "$worker" ] || worker=$(cd "$build" && pwd)/dist_test_worker
[ -x "$worker" ] || { echo "build dist_test_worker first (cmake --build $build --target dist_test_worker)" >&2; exit 1; }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader,tcp"
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT

for w in 2 4; do
  ALPACA_TEST_BACKEND=gloo "$worker" --nproc_per_node "$w" bench "$sizes" | sed -n 's/^\[rank 0\]: //p' | grep '^BENCH' | sed 's/$/ where one-host/' >> "$raw"
  $mpi -np "$w" "$worker" bench "$sizes" | grep '^BENCH' | sed 's/$/ where one-host/' >> "$raw"
  ALPACA_GLOO_SHM=0 ALPACA_TEST_BACKEND=gloo "$worker" --nproc_per_node "$w" bench "$sizes" | sed -n 's/^\[rank 0\]: //p' | grep '^BENCH' | sed 's/^BENCH gloo/BENCH gloo-tcp/; s/$/ where one-host/' >> "$raw"
  ALPACA_TEST_BACKEND=store "$worker" --nproc_per_node "$w" bench "$store_sizes" | sed -n 's/^\[rank 0\]: //p' | grep '^BENCH' | sed 's/$/ where one-host/' >> "$raw"
done

if [ "${ALPACA_BENCH_NETNS:-0}" = 1 ]; then
  tag="abn$$"
  "$here/netns_testbed.sh" up "$tag" 2
  trap '"$here/netns_testbed.sh" down "$tag" 2; rm -f "$raw"' EXIT
  for w in 2 4; do
    per=$((w / 2))
    node() { ip netns exec "$tag-n$1" "$worker" --nnodes 2 --node_rank "$1" --master_addr 10.231.0.1 --master_port 29500 --nproc_per_node "$per" bench "$sizes"; }
    node 1 > /dev/null & pid=$!
    node 0 | sed -n 's/^\[rank 0\]: //p' | grep '^BENCH' | sed 's/$/ where 2-netns/' >> "$raw"
    wait $pid
    hosts=$(mktemp)
    printf "n0 slots=%d\nn1 slots=%d\n" "$per" "$per" > "$hosts"
    ALPACA_NETNS_PREFIX=$tag PMIX_MCA_gds=hash ip netns exec "$tag-n0" $mpi -np "$w" --hostfile "$hosts" --mca plm_rsh_agent "$here/netns_rsh_agent.sh" \
      --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 -x ALPACA_NETNS_PREFIX -x PMIX_MCA_gds -x OMP_NUM_THREADS \
      "$worker" bench "$sizes" | grep '^BENCH' | sed 's/$/ where 2-netns/' >> "$raw"
    rm -f "$hosts"
  done
fi

# BENCH <backend> world <W> <op> <MiB> MiB <ms> ms <GB/s> GB/s cpu <s> s where <where>
echo "| where | ranks | op | MiB | gloo ms (GB/s, cpu s) | gloo TCP ms (GB/s, cpu s) | mpi ms (GB/s, cpu s) | store ms (GB/s, cpu s) | gloo / mpi |"
echo "|---|---|---|---|---|---|---|---|---|"
awk '{ key = $16 "|" $4 "|" $5 "|" $6; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
       cell[key, $2] = sprintf("%.1f (%.2f, %.2f)", $8, $10, $13); ms[key, $2] = $8 }
     END {
       for (i = 1; i <= n; i++) {
         k = order[i]; split(k, f, "|")
         ratio = (ms[k, "gloo"] && ms[k, "mpi"]) ? sprintf("%.2f", ms[k, "gloo"] / ms[k, "mpi"]) : "-"
         printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], f[4],
           (cell[k, "gloo"] ? cell[k, "gloo"] : "-"), (cell[k, "gloo-tcp"] ? cell[k, "gloo-tcp"] : "-"), (cell[k, "mpi"] ? cell[k, "mpi"] : "-"), (cell[k, "store"] ? cell[k, "store"] : "-"), ratio
       }
     }' "$raw"
