#!/usr/bin/env bash
# A throwaway one-node Slurm for tests: munged, slurmctld and slurmd started as root without
# systemd, all state, spool, sockets and logs under one directory, no accounting.
#   slurm_cluster.sh start DIR [CPUS]   # prints the SLURM_CONF to export; waits until the node is idle
#   slurm_cluster.sh stop DIR           # stops exactly the daemons that `start DIR` started
# Needs Debian's slurmctld, slurmd, slurm-client and munge (scripts/install_deps.sh, test extra).
set -euo pipefail
cmd=${1:?usage: slurm_cluster.sh start|stop DIR}
dir=$(mkdir -p "${2:?usage: slurm_cluster.sh start|stop DIR}" && cd "$2" && pwd)

stop() {
  # Daemons by the pid files we wrote, never by name: other Slurms may run on this machine.
  for d in slurmd slurmctld munged; do
    local f="$dir/$d.pid"
    [ -s "$f" ] || continue
    local pid; pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start() {
  local cpus=${1:-}
  [ "$(id -u)" -eq 0 ] || { echo "slurm_cluster.sh: needs root (slurmd runs jobs as their users)" >&2; exit 2; }
  for b in munged mungekey slurmctld slurmd sbatch scontrol; do
    command -v "$b" >/dev/null || { echo "slurm_cluster.sh: $b not found; run scripts/install_deps.sh" >&2; exit 2; }
  done
  stop
  mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
  chmod 755 "$dir/munge"
  [ -s "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" --bits=1024 >/dev/null
  chmod 400 "$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed"
  local host node
  host=$(hostname -s)
  # The node line as slurmd sees the machine (minus UpTime); CPUS overrides the count so a 2-core
  # CI box can run 2 tasks plus the batch shell.
  node=$(slurmd -C | head -1)
  if [ -n "$cpus" ]; then
    node=$(echo "$node" | sed -E "s/CPUs=[0-9]+/CPUs=$cpus/; s/Boards=[0-9]+ SocketsPerBoard=[0-9]+ CoresPerSocket=[0-9]+ ThreadsPerCore=[0-9]+/Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1/")
  fi
  cat > "$dir/slurm.conf" <<CONF
ClusterName=alpacatest
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=30
SchedulerParameters=sched_interval=5
GresTypes=gpu
SlurmdParameters=config_overrides
$node Gres=gpu:4 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  # Four stand-in "GPUs" (character devices like /dev/null; plain files where mknod is not
  # allowed, which slurmd accepts with an error in its log) so the scripts' --gpus-per-node
  # requests are scheduled as written, two 2-GPU jobs at a time. TaskPlugin=task/none binds nothing.
  for i in 0 1 2 3; do
    [ -e "$dir/fake-gpu$i" ] || mknod "$dir/fake-gpu$i" c 1 3 2>/dev/null || touch "$dir/fake-gpu$i"
  done
  echo "NodeName=$host Name=gpu File=$dir/fake-gpu[0-3]" > "$dir/gres.conf"
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$dir/slurm.conf"
  slurmd -f "$dir/slurm.conf"
  for _ in $(seq 120); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qx idle; then echo "$dir/slurm.conf"; return 0; fi
    sleep 0.5
  done
  echo "slurm_cluster.sh: the node did not become idle within 60 s; logs:" >&2
  tail -n 30 "$dir"/slurmctld.log "$dir"/slurmd.log "$dir"/munged.log >&2 || true
  sinfo -N -l >&2 || true
  exit 1
}

case "$cmd" in
  start) start "${3:-}" ;;
  stop) stop ;;
  *) echo "usage: slurm_cluster.sh start|stop DIR [CPUS]" >&2; exit 2 ;;
esac
