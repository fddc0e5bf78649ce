#!/usr/bin/env bash
# Two "hosts" on one machine for the `multihost` tests: two network namespaces joined by a veth pair,
# 10.200.0.1 and 10.200.0.2 (a private range that exists only between these two namespaces), each with
# its own host name (a UTS namespace per command), so Open MPI sees two nodes that talk over TCP.
#
#   tests/multihost/netns-hosts.sh up DIR     create the namespaces and write, under DIR:
#       hostfile      "10.200.0.1 slots=1" and "10.200.0.2 slots=1"
#       on-host-a, on-host-b   run a command on that host: on-host-a mpirun ...
#       agent         mpirun's launch agent (--mca plm_rsh_agent DIR/agent): enters the namespace of the
#                     host it is given instead of ssh-ing to it
#       hosts.json    addresses, namespaces, interfaces and host names, for the tests
#   tests/multihost/netns-hosts.sh down DIR   kill what runs in the namespaces, delete them (idempotent)
#
# Names derive from DIR, so two builds can test at once. CTest runs `down` as a FIXTURES_CLEANUP test,
# which runs even when a test failed or timed out. Needs root and iproute2, util-linux (unshare).
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
ACTION=$1
DIR=$(realpath -m "$2")
TAG=$(printf '%s' "$DIR" | md5sum | cut -c1-6)
NS_A=shl-$TAG-a NS_B=shl-$TAG-b
IF_A=shl${TAG}a IF_B=shl${TAG}b
ADDR_A=10.200.0.1 ADDR_B=10.200.0.2
NAME_A=shl-host-a NAME_B=shl-host-b

log() { echo "netns-hosts: $*" >&2; }

hosts_down() {
  local ns pid
  for ns in "$NS_A" "$NS_B"; do
    if ip netns list | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  # Deleting a namespace deletes its end of the pair and with it the other; this covers a half-made pair.
  ip link del "$IF_A" 2>/dev/null || true
  rm -f "$DIR"/{hostfile,on-host-a,on-host-b,agent,hosts.json}
}

# on-host-X: run "$@" inside namespace $1 with host name $2.
write_on_host() {
  cat >"$DIR/$1" <<EOF
#!/bin/sh
# Runs a command on $3 ($4): inside network namespace $2, with host name $3.
exec ip netns exec $2 unshare --uts /bin/sh -c 'hostname $3 && exec "\$@"' sh "\$@"
EOF
  chmod +x "$DIR/$1"
}

hosts_up() {
  for tool in ip unshare md5sum; do
    command -v "$tool" >/dev/null || { log "$tool not found: run scripts/install-deps.sh"; return 4; }
  done
  [ "$(id -u)" -eq 0 ] || { log "must run as root (network namespaces)"; return 4; }
  hosts_down
  mkdir -p "$DIR"
  ip netns add "$NS_A"
  ip netns add "$NS_B"
  ip link add "$IF_A" type veth peer name "$IF_B"
  ip link set "$IF_A" netns "$NS_A"
  ip link set "$IF_B" netns "$NS_B"
  ip -n "$NS_A" addr add "$ADDR_A/24" dev "$IF_A"
  ip -n "$NS_B" addr add "$ADDR_B/24" dev "$IF_B"
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_A" link set "$IF_A" up
  ip -n "$NS_B" link set "$IF_B" up

  write_on_host on-host-a "$NS_A" "$NAME_A" "$ADDR_A"
  write_on_host on-host-b "$NS_B" "$NAME_B" "$ADDR_B"
  # mpirun calls the agent as `agent HOST COMMAND...`, COMMAND being one shell line (orted and its flags).
  cat >"$DIR/agent" <<EOF
#!/bin/sh
# mpirun's launch agent for the two namespace hosts: what ssh would be on a real cluster.
host=\$1; shift
case "\$host" in
  $ADDR_A|$NAME_A) exec "$DIR/on-host-a" /bin/sh -c "\$*" ;;
  $ADDR_B|$NAME_B) exec "$DIR/on-host-b" /bin/sh -c "\$*" ;;
  *) echo "agent: unknown host '\$host' (this test cluster has $ADDR_A and $ADDR_B)" >&2; exit 255 ;;
esac
EOF
  chmod +x "$DIR/agent"
  printf '%s slots=1\n%s slots=1\n' "$ADDR_A" "$ADDR_B" >"$DIR/hostfile"
  cat >"$DIR/hosts.json" <<EOF
{"hosts": [
  {"address": "$ADDR_A", "netns": "$NS_A", "interface": "$IF_A", "hostname": "$NAME_A", "run": "$DIR/on-host-a"},
  {"address": "$ADDR_B", "netns": "$NS_B", "interface": "$IF_B", "hostname": "$NAME_B", "run": "$DIR/on-host-b"}
], "subnet": "10.200.0.0/24", "hostfile": "$DIR/hostfile", "agent": "$DIR/agent"}
EOF
  # The link must carry TCP before the tests start (a veth is up at once, but check rather than hope).
  if ! ip netns exec "$NS_A" timeout 5 bash -c "until (exec 3<>/dev/tcp/$ADDR_B/9) 2>&1 | grep -q refused; do sleep 0.1; done"; then
    log "no TCP between $ADDR_A and $ADDR_B"
    return 1
  fi
  log "up: $NAME_A=$ADDR_A ($NS_A), $NAME_B=$ADDR_B ($NS_B)"
}

case "$ACTION" in
  up)
    if ! hosts_up; then
      log "set-up failed; tearing down"
      hosts_down
      exit 1
    fi
    ;;
  down)
    hosts_down
    # The acceptance test of `down`: no namespace or interface of these hosts may outlive it.
    if ip netns list | grep -qwE "$NS_A|$NS_B" || ip link show "$IF_A" >/dev/null 2>&1; then
      log "left behind: $(ip netns list | grep -wE "$NS_A|$NS_B" | tr '\n' ' ')"
      exit 1
    fi
    ;;
  *) usage ;;
esac
