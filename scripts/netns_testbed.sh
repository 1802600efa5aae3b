#!/usr/bin/env bash
# A multi-node test bed on one machine (root only): every "node" is a Linux network namespace with
# its own veth interface and address, all plugged into a bridge that lives in a namespace of its
# own, so ranks on different nodes talk over a real TCP/IP stack (veth, bridge, ARP), never
# loopback, and nothing is added to the host's own network namespace.
#
#   scripts/netns_testbed.sh up   <tag> <nodes>   make <tag>-sw (bridge) and <tag>-n0..n<nodes-1>
#   scripts/netns_testbed.sh down <tag> <nodes>   remove them (idempotent)
#   scripts/netns_testbed.sh check                exit 0 when namespaces can be made here
#
# Node i is namespace <tag>-n<i>, interface "eth0" (its veth end) with address 10.231.0.(i+1)/24;
# addresses exist only inside these namespaces. Run a node's processes with
#   ip netns exec <tag>-n<i> <command>
# and read its traffic from /sys/class/net/eth0/statistics/{rx,tx}_bytes inside the namespace.
# <tag> must be short (interface names are at most 15 characters) and unique per concurrent run.
set -euo pipefail

cmd=${1:-}
subnet=10.231.0

check() {
  [ "$(id -u)" = 0 ] || { echo "netns test bed: needs root (ip netns add)"; return 1; }
  command -v ip >/dev/null || { echo "netns test bed: iproute2 (ip) is not installed"; return 1; }
  local probe="alpcheck$$"
  ip netns add "$probe" 2>/dev/null || { echo "netns test bed: ip netns add fails here (no CAP_SYS_ADMIN or no netns support)"; return 1; }
  ip netns del "$probe"
}

down() {
  local tag=$1 nodes=$2
  for ((i = 0; i < nodes; i++)); do
    ip netns del "$tag-n$i" 2>/dev/null || true
    rm -rf "/dev/shm/$tag-n$i" "/tmp/$tag-n$i"  # netns_rsh_agent.sh's per-node shm and session directories
  done
  ip netns del "$tag-sw" 2>/dev/null || true
}

up() {
  local tag=$1 nodes=$2
  down "$tag" "$nodes"
  trap 'down "$tag" "$nodes"' ERR
  ip netns add "$tag-sw"
  ip -n "$tag-sw" link add br0 type bridge
  ip -n "$tag-sw" link set br0 up
  for ((i = 0; i < nodes; i++)); do
    local ns="$tag-n$i"
    ip netns add "$ns"
    # Made inside the node's namespace, the peer end moved to the switch namespace.
    ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$tag-sw"
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$tag-sw" link set "p$i" master br0
    ip -n "$tag-sw" link set "p$i" up
  done
  trap - ERR
  # The bridge (STP off) forwards as soon as its ports are up; wait until every port says so.
  for _ in $(seq 50); do
    [ "$(bridge -n "$tag-sw" link show | grep -c 'state forwarding')" -ge "$nodes" ] && return 0
    sleep 0.1
  done
  echo "netns test bed: the bridge in $tag-sw does not forward on all $nodes ports" >&2
  down "$tag" "$nodes"
  return 1
}

case "$cmd" in
  check) check ;;
  up) up "${2:?tag}" "${3:-2}" ;;
  down) down "${2:?tag}" "${3:-2}" ;;
  *) echo "usage: $0 up|down <tag> <nodes> | check" >&2; exit 2 ;;
esac
