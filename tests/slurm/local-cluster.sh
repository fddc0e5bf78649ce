#!/usr/bin/env bash
# A real one-node Slurm cluster on localhost for the `slurm` tests: munged, slurmctld and slurmd, each
# with its own key, socket, ports, state and logs under DIR, so it never touches /etc/slurm, /etc/munge
# or a cluster someone else runs on this machine (two builds may test at once).
#
#   tests/slurm/local-cluster.sh up DIR     start the daemons; wait until the node is idle
#   tests/slurm/local-cluster.sh down DIR   stop them and every process that still runs from DIR
#   tests/slurm/local-cluster.sh env DIR    print the exports client commands need (SLURM_CONF)
#
# `up` cleans up after itself when it fails half-way; `down` is idempotent, so CTest runs it as a
# FIXTURES_CLEANUP test that runs even when a test failed or timed out. Needs root (slurmd runs jobs as
# the submitting user and must be able to become them) and the Debian packages munge, slurmctld, slurmd,
# slurm-client (scripts/install-deps.sh).
set -euo pipefail

usage() { echo "usage: $0 up|down|env DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
ACTION=$1
DIR=$(realpath -m "$2")

log() { echo "local-cluster: $*" >&2; }

# A free TCP port on 127.0.0.1 from a range few services use; ss lists those already bound.
free_port() {
  local port
  for _ in $(seq 200); do
    port=$((20000 + RANDOM % 20000))
    if ! ss -Hltn "sport = :$port" | grep -q .; then echo "$port"; return; fi
  done
  log "no free TCP port found"; return 1
}

write_slurm_conf() {
  local ctld_port=$1 slurmd_port=$2 srun_low=$3
  # Every line is needed in this container or by the tests; see docs/cluster.md for a real cluster.
  cat >"$DIR/slurm.conf" <<EOF
ClusterName=shardline-test
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
# srun listens for its tasks on these ports; a private range keeps two test clusters apart.
SrunPortRange=$srun_low-$((srun_low + 99))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket.2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmdDebug=info
SlurmctldDebug=info
# No cgroups in this container: processes are tracked through /proc, tasks bound with sched_setaffinity.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/builtin
# A node that was down (an earlier run) comes back by itself; finished jobs stay visible to scontrol.
ReturnToService=2
MinJobAge=600
InactiveLimit=0
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=30 State=UP
EOF
}

# Waits until `sinfo` reports the node idle (slurmd registered with slurmctld).
wait_for_idle_node() {
  local state=""
  for _ in $(seq 150); do
    state=$(SLURM_CONF="$DIR/slurm.conf" sinfo -h -n localhost -o %t 2>/dev/null || true)
    if [ "$state" = "idle" ]; then return 0; fi
    sleep 0.2
  done
  log "node did not become idle (state '${state:-unknown}'); last log lines:"
  tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
  return 1
}

# True when process $1 belongs to this cluster: it was started with DIR in its command line (munged
# --key-file DIR/..., slurmctld -f DIR/slurm.conf) or runs inside DIR (slurmstepd renames itself to
# "slurmstepd: [7.0]" but works in DIR/log; job tasks work in DIR/jobs/...). Never another cluster's.
is_ours() {
  { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null | grep -qF -- "$DIR" && return 0
  case "$(readlink "/proc/$1/cwd" 2>/dev/null)/" in "$DIR"/*) return 0 ;; esac
  return 1
}

# A step daemon reports the end of its step to slurmctld; one that cannot (controller already gone)
# retries for minutes. So let the steps of jobs that just ended finish first (at most 10 s).
wait_for_step_daemons() {
  local busy proc
  for _ in $(seq 50); do
    busy=0
    for proc in /proc/[0-9]*; do
      [ "$(cat "$proc/comm" 2>/dev/null)" = slurmstepd ] && is_ours "${proc#/proc/}" && busy=1 && break
    done
    [ "$busy" -eq 0 ] && return 0
    sleep 0.2
  done
}

# TERM to the daemons (all at once: each takes a second or two to shut down), KILL after 10 s.
stop_daemons() {
  local pids=() pid name alive
  for name in slurmd slurmctld munged; do
    pid=$(cat "$DIR/run/$name.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && is_ours "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for _ in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# Whatever still runs from DIR: job steps, slurmstepd, a daemon whose pid file was lost.
kill_processes_of_dir() {
  local pid
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [ "$pid" = "$$" ] && continue
    if is_ours "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
}

cluster_down() {
  wait_for_step_daemons
  stop_daemons
  kill_processes_of_dir
  # Keep the logs for a failed test's post-mortem; drop the state so a next `up` starts clean.
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/munge" "$DIR/run"
}

cluster_up() {
  for tool in munged mungekey slurmctld slurmd sbatch sinfo ss; do
    command -v "$tool" >/dev/null || { log "$tool not found: run scripts/install-deps.sh"; return 4; }
  done
  [ "$(id -u)" -eq 0 ] || { log "must run as root (slurmd starts jobs as their user)"; return 4; }
  cluster_down  # a previous run that was killed may have left something behind
  mkdir -p "$DIR"/{state,spool,run,log,munge,jobs}
  # munged refuses a socket folder that others may write to, and clients need to reach into it.
  chmod 0755 "$DIR" "$DIR/munge"
  chmod 0700 "$DIR/state" "$DIR/run"
  chmod 0777 "$DIR/jobs"  # job output files

  mungekey --create --keyfile "$DIR/run/munge.key" --force
  chmod 0600 "$DIR/run/munge.key"
  munged --key-file "$DIR/run/munge.key" --socket "$DIR/munge/munge.socket.2" --pid-file "$DIR/run/munged.pid" \
    --log-file "$DIR/log/munged.log" --seed-file "$DIR/run/munged.seed" --force
  for _ in $(seq 50); do [ -S "$DIR/munge/munge.socket.2" ] && break; sleep 0.1; done

  local ctld_port slurmd_port srun_low
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  srun_low=$(free_port)
  write_slurm_conf "$ctld_port" "$slurmd_port" "$srun_low"
  # -i: ignore any saved state (a fresh cluster); slurmd -N: this node's name whatever the hostname is.
  slurmctld -f "$DIR/slurm.conf" -i
  slurmd -f "$DIR/slurm.conf" -N localhost
  wait_for_idle_node
  log "up: SLURM_CONF=$DIR/slurm.conf (slurmctld port $ctld_port, slurmd port $slurmd_port)"
}

case "$ACTION" in
  up)
    if ! cluster_up; then
      log "start-up failed; tearing down"
      cluster_down
      exit 1
    fi
    ;;
  down)
    cluster_down
    # The acceptance test of `down`: nothing of this cluster may outlive it.
    sleep 0.2
    for proc in /proc/[0-9]*; do
      pid=${proc#/proc/}
      if [ "$pid" != "$$" ] && is_ours "$pid" && [ "$(cut -d' ' -f3 "$proc/stat" 2>/dev/null)" != Z ]; then
        log "left behind: pid $pid ($(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null))"
        exit 1
      fi
    done
    ;;
  env) echo "export SLURM_CONF=$DIR/slurm.conf" ;;
  *) usage ;;
esac
