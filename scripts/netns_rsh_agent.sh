#!/bin/sh
# Open MPI's remote-shell agent for the network-namespace test bed (scripts/netns_testbed.sh):
#   mpirun --hostfile <file naming n0, n1, ...> --mca plm_rsh_agent scripts/netns_rsh_agent.sh ...
# Open MPI calls it as `<agent> <host> <command...>` to start its daemon on <host>; here host
# "n<i>" is the namespace "$ALPACA_NETNS_PREFIX-n<i>" (the test bed's tag), entered with
# `ip netns exec` instead of ssh. Root only, like the test bed.
# The "nodes" share one kernel and one /dev/shm, which real nodes never do: each gets its own
# directory for the shared-memory transport's segments (vader names them by host name and local
# rank, so node 0's local rank 0 and node 1's would collide and crash). They share /tmp and a host
# name too, so each daemon also gets its own session-directory base: in the shared
# /tmp/ompi.<host>.<uid>, mpirun and the remote daemon both create the job's directory, and under
# load one mkdir lost that race ("A call to mkdir was unable to create ... File exists").
host=$1
shift
: "${ALPACA_NETNS_PREFIX:?set ALPACA_NETNS_PREFIX to the test bed tag}"
shm=/dev/shm/$ALPACA_NETNS_PREFIX-$host
tmp=/tmp/$ALPACA_NETNS_PREFIX-$host
mkdir -p "$shm" "$tmp"
exec ip netns exec "$ALPACA_NETNS_PREFIX-$host" env OMPI_MCA_btl_vader_backing_directory="$shm" \
  OMPI_MCA_orte_tmpdir_base="$tmp" /bin/sh -c "$*"
