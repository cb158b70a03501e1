#!/usr/bin/env bash
# A network between the fake nodes of the test cluster. minicluster.sh runs every node on
# 127.0.0.1, so a multi-node run crosses no network and its all-reduce is as fast as
# memory. This gives each node its own network namespace, joined through a bridge by links
# shaped to a site-like rate, so that what crosses "nodes" is limited like a real fabric.
#
#   netns.sh up [--nodes N] [--rate RATE]   N in 1..99 (default 4), RATE as tc writes it
#                                           (default 1gbit); again with another rate reshapes
#   netns.sh down                           refuses while a process still runs inside
#   netns.sh exec nK|br -- CMD...           run CMD in node K's (or the bridge's) namespace
#   netns.sh status                         exit 0 when every link is up and shaped
#
# Layout (see README.md here): namespace ddpscale-nK holds ib0 = 10.77.0.K/24 (as a site
# names its fabric interface) and lo; namespace ddpscale-br holds bridge br0 with one port
# per node (nK) and one (root) whose peer ddpscale0 = 10.77.0.254/24 is in the root
# namespace, where slurmctld and the test process run. Both directions of every node's link
# are shaped with tbf; the root namespace's link is not (only control traffic uses it).
set -euo pipefail

PREFIX=ddpscale
BR_NS=$PREFIX-br
NET=10.77.0                 # node K is $NET.K
ROOT_IF=ddpscale0           # the root namespace's end of its link into the bridge
ROOT_ADDR=$NET.254
NODES=4 RATE=1gbit

die() { echo "netns: $*" >&2; exit 1; }
say() { echo "netns: $*"; }

# Plain nsenter, not 'ip netns exec': that one also unshares the mount namespace and
# remounts /sys, and a slurmd started under it loses its view of the cgroup mounts.
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" -- "$@"; }
# A real namespace is an nsfs bind mount. /run is on disk on some machines, so after a
# reboot a plain file of that name may be left, which nsenter cannot enter.
is_ns() { [[ $(stat -f -c %T "/run/netns/$1" 2>/dev/null) == nsfs ]]; }
node_files() { ls /run/netns 2>/dev/null | grep -E "^$PREFIX-n[0-9]+$" | sort -V || true; }
node_names() { local n; for n in $(node_files); do if is_ns "$n"; then echo "$n"; fi; done; }
ours() { node_files; if [[ -e /run/netns/$BR_NS ]]; then echo "$BR_NS"; fi; }

need_root_and_tools() {
  ((EUID == 0)) || die "must run as root (it creates network namespaces); rerun with sudo"
  local c missing=()
  for c in ip tc nsenter unshare; do command -v "$c" >/dev/null || missing+=("$c"); done
  ((${#missing[@]} == 0)) || die "${missing[*]} not found; install them: apt-get install iproute2 util-linux"
  # Probe in a throwaway namespace, so a machine that cannot is refused before any change.
  unshare --net true 2>/dev/null ||
    die "cannot create a network namespace here (a container without CAP_SYS_ADMIN?); run on a VM or host"
  unshare --net tc qdisc add dev lo root tbf rate 1mbit burst 10k latency 1ms 2>/dev/null ||
    die "this kernel has no tbf qdisc; run 'modprobe sch_tbf' (kernel option CONFIG_NET_SCH_TBF)"
}

# The rate in bytes/s as tc itself reads it (so 2.5gbit, 800mbit, 1Gbit all work).
rate_bytes() {
  unshare --net sh -c "tc qdisc add dev lo root tbf rate '$1' burst 10k latency 1ms &&
    tc -j qdisc show dev lo" 2>/dev/null | grep -o '"rate":[0-9]*' | cut -d: -f2
}

# One TCP stream reaches ~95% of the rate (the rest is Ethernet/IP/TCP headers) when the
# bucket holds 1 ms of traffic (at least 64 KiB: one GSO packet, else tbf splits each one)
# and the queue 20 ms: TCP's in-flight data then fits in the queue and is never dropped.
# A larger bucket would let the first ~bucket bytes of each message pass at memory speed.
shape() {  # shape NS DEV BYTES_PER_S
  local burst=$(($3 / 1000)); ((burst >= 65536)) || burst=65536
  in_ns "$1" tc qdisc replace dev "$2" root tbf rate "$(($3 * 8))bit" burst "$burst" latency 20ms
}
shaped_rate() {  # bytes/s of the tbf on NS DEV, empty when there is none
  in_ns "$1" tc -j qdisc show dev "$2" 2>/dev/null | grep -o '"rate":[0-9]*' | head -n1 | cut -d: -f2 || true
}
shaped_bits() { local b; b=$(shaped_rate "$@"); echo $((${b:-0} * 8)); }

ensure_ns() {
  is_ns "$1" && return 0
  rm -f "/run/netns/$1"                     # a stale plain file (see is_ns)
  ip netns add "$1"
  in_ns "$1" ip link set lo up
}

# Problems of the current state against NODES nodes at BYTES/s, one per line; none = healthy.
problems() {  # problems NODES BYTES
  local i ns
  is_ns "$BR_NS" || { echo "no namespace $BR_NS"; return; }
  [[ $(ip -o -4 addr show dev "$ROOT_IF" 2>/dev/null) == *" $ROOT_ADDR/24 "* ]] ||
    echo "$ROOT_IF has not $ROOT_ADDR/24"
  for ((i = 1; i <= $1; i++)); do
    ns=$PREFIX-n$i
    is_ns "$ns" || { echo "no namespace $ns"; continue; }
    [[ $(in_ns "$ns" ip -o -4 addr show dev ib0 2>/dev/null) == *" $NET.$i/24 "* ]] ||
      echo "$ns: ib0 has not $NET.$i/24"
    # Flags, not "state UP": operstate follows a moment later (the kernel's linkwatch).
    [[ $(in_ns "$ns" ip -o link show dev ib0 2>/dev/null) == *[\<,]UP,LOWER_UP[,\>]* ]] || echo "$ns: ib0 is not up"
    [[ $(in_ns "$BR_NS" ip -o link show dev "n$i" 2>/dev/null) == *"master br0 "* ]] || echo "n$i is not on br0"
    [[ $(shaped_rate "$ns" ib0) == "$2" ]] || echo "$ns: ib0 is not shaped to $2 bytes/s"
    [[ $(shaped_rate "$BR_NS" "n$i") == "$2" ]] || echo "$BR_NS: n$i is not shaped to $2 bytes/s"
  done
}

cmd_up() {
  while (($#)); do
    case $1 in
      --nodes) NODES=${2:?}; shift 2 ;;
      --rate) RATE=${2:?}; shift 2 ;;
      *) die "unknown option for up: $1 (known: --nodes N --rate RATE)" ;;
    esac
  done
  [[ $NODES =~ ^[1-9][0-9]?$ ]] || die "--nodes must be 1-99 (got $NODES)"
  need_root_and_tools
  local bytes i ns have
  bytes=$(rate_bytes "$RATE") && [[ $bytes =~ ^[1-9][0-9]*$ ]] ||
    die "--rate must be a rate as tc writes it, like 1gbit or 500mbit (got $RATE)"

  # Another node count would leave a running slurmd without its network: refuse.
  have=$(node_names | wc -l)
  ((have == 0 || have == NODES)) || die "already up with $have nodes; run 'netns.sh down' first to get $NODES"
  if [[ -z $(problems "$NODES" "$bytes") ]]; then
    say "already up: $NODES nodes at $RATE"; return 0
  fi
  # 10.77.0.0/24 must be ours alone in the root namespace, else its traffic would be misrouted.
  if ip -o -4 route show | grep -v " dev $ROOT_IF " | grep -q "^$NET\.0/24 "; then
    die "$NET.0/24 is already routed here ($(ip -o -4 route show "$NET.0/24" | head -n1)); remove that route first"
  fi

  ensure_ns "$BR_NS"
  in_ns "$BR_NS" ip link show br0 >/dev/null 2>&1 || in_ns "$BR_NS" ip link add br0 type bridge
  in_ns "$BR_NS" ip link set br0 up
  if ! ip link show "$ROOT_IF" >/dev/null 2>&1; then
    ip link add "$ROOT_IF" type veth peer name root netns "$BR_NS"
  fi
  ip addr replace "$ROOT_ADDR/24" dev "$ROOT_IF"
  ip link set "$ROOT_IF" up
  in_ns "$BR_NS" ip link set root master br0 up

  for ((i = 1; i <= NODES; i++)); do
    ns=$PREFIX-n$i
    ensure_ns "$ns"
    if ! in_ns "$BR_NS" ip link show "n$i" >/dev/null 2>&1; then
      in_ns "$BR_NS" ip link add "n$i" type veth peer name ib0 netns "$ns"
    fi
    in_ns "$ns" ip addr replace "$NET.$i/24" dev ib0
    in_ns "$ns" ip link set ib0 up
    in_ns "$BR_NS" ip link set "n$i" master br0 up
    shape "$ns" ib0 "$bytes"                # node -> bridge
    shape "$BR_NS" "n$i" "$bytes"           # bridge -> node
  done

  local left; left=$(problems "$NODES" "$bytes")
  [[ -z $left ]] || die "up left problems: ${left//$'\n'/; }"
  say "up: $NODES nodes ($NET.1..$NET.$NODES on ib0) at $RATE each way; root namespace is $ROOT_ADDR on $ROOT_IF"
}

# Pids whose network namespace is NS (nsenter'd daemons hold it past 'ip netns del').
pids_in() {
  local inode p; inode=$(stat -L -c %i "/run/netns/$1" 2>/dev/null) || return 0
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/ns/net" 2>/dev/null) == "net:[$inode]" ]] && echo "${p#/proc/}($(cat "$p/comm" 2>/dev/null))"
  done
  return 0
}

cmd_down() {
  (($# == 0)) || die "down takes no options (got $*)"
  ((EUID == 0)) || die "must run as root (it deletes network namespaces); rerun with sudo"
  local ns busy=() pids i
  for ns in $(ours); do
    is_ns "$ns" || continue
    pids=$(pids_in "$ns" | tr '\n' ' ')
    if [[ -n $pids ]]; then busy+=("$ns: $pids"); fi
  done
  # A process left inside would keep its namespace (and any slurmd in it) alive, unreachable.
  ((${#busy[@]} == 0)) || die "processes still run in ${busy[*]}; stop them first (minicluster.sh down)"
  # Delete the links first: a namespace's devices go asynchronously after 'ip netns del',
  # a veth deleted here takes its peer with it at once.
  if is_ns "$BR_NS"; then
    for i in $(node_names); do in_ns "$BR_NS" ip link del "n${i#"$PREFIX"-n}" 2>/dev/null || true; done
  fi
  ip link del "$ROOT_IF" 2>/dev/null || true
  for ns in $(ours); do
    if is_ns "$ns"; then ip netns del "$ns"; else rm -f "/run/netns/$ns"; fi
  done
  say "down: no $PREFIX namespace or link left"
}

cmd_exec() {
  local node=${1:-}; shift || true
  [[ ${1:-} == -- ]] && shift
  [[ -n $node && $# -gt 0 ]] || die "usage: netns.sh exec nK|br -- CMD..."
  ((EUID == 0)) || die "must run as root (entering a namespace needs CAP_SYS_ADMIN); rerun with sudo"
  local ns=$PREFIX-${node#"$PREFIX"-}
  is_ns "$ns" || die "no namespace $ns; run 'netns.sh up' first"
  exec nsenter --net="/run/netns/$ns" -- "$@"
}

cmd_status() {
  ((EUID == 0)) || die "must run as root (reading other namespaces needs it); rerun with sudo"
  local names n i ns bytes left
  names=$(node_names); n=$(echo -n "$names" | grep -c . || true)
  ((n > 0)) || { say "down"; return 1; }
  bytes=$(shaped_rate "$PREFIX-n1" ib0)
  printf '%-14s %-12s %-14s %-14s %s\n' namespace address "out (bit/s)" "in (bit/s)" processes
  printf '%-14s %-12s %-14s %-14s %s\n' "(root)" "$ROOT_ADDR" - - "$ROOT_IF"
  for ns in $names; do
    i=${ns#"$PREFIX"-n}
    printf '%-14s %-12s %-14s %-14s %s\n' "$ns" "$NET.$i" "$(shaped_bits "$ns" ib0)" \
      "$(shaped_bits "$BR_NS" "n$i")" "$(pids_in "$ns" | tr '\n' ' ')"
  done
  left=$(problems "$n" "${bytes:-0}")
  [[ -z $left ]] || die "not healthy: ${left//$'\n'/; }"
}

case ${1:-} in
  up|down|exec|status) cmd=$1; shift; "cmd_$cmd" "$@" ;;
  *) die "usage: netns.sh up [--nodes N] [--rate RATE] | down | exec nK -- CMD... | status" ;;
esac
