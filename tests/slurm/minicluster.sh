#!/usr/bin/env bash
# A throwaway SLURM cluster on this one machine, for trying ddpscale's SLURM profiles and
# for the test suite: N fake nodes (n1..nN, one slurmd each) with fake GPUs in partition
# "debug", each in a network namespace of its own (hostname nK, interface ib0 at 10.77.0.K,
# linked through a bridge shaped to RATE each way: netns.sh), nodes and partitions shaped like
# Gilbreth and Raven with their submission rules (job_submit.lua), and accounting (slurmdbd on
# a MariaDB of its own). Needs root and Debian/Ubuntu (apt). See README.md here.
#
#   minicluster.sh up [--nodes N] [--gpus-per-node G] [--cpus-per-node C] [--rate RATE]
#                     [--no-network] [--force]
#   minicluster.sh status
#   minicluster.sh down [--purge]
set -euo pipefail

STATE=${DDPSCALE_SLURM_DIR:-/tmp/ddpscale-slurm}
ETC=/etc/slurm            # the default path: Snakemake's SLURM jobstep drops SLURM_CONF
MARK="# written by ddpscale tests/slurm/minicluster.sh"
HOSTS_TAG="# ddpscale-minicluster"
NODES=4 GPUS=4 CPUS=2 FORCE=0 PURGE=0 NETWORK=1 RATE=1gbit
NET=10.77.0                 # netns.sh's addresses: node K is $NET.K, the root namespace $NET.254
NETNS=(bash "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/netns.sh")

die() { echo "minicluster: $*" >&2; exit 1; }
say() { echo "minicluster: $*"; }
# Our files start with MARK as a comment: "# ..." or, in job_submit.lua, "-- ...".
ours() {
  local f=$ETC/${1:-slurm.conf} first
  [[ -f $f ]] && first=$(head -n1 "$f") && [[ $first == "$MARK" || $first == "-- ${MARK#\# }" ]]
}
OUR_FILES=(slurm.conf gres.conf slurmdbd.conf job_submit.lua)
HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
# shellcheck source=accounting.sh
source "$HERE/accounting.sh"
# shellcheck source=siteconf.sh
source "$HERE/siteconf.sh"

# While our config is in place, its state folder wins over DDPSCALE_SLURM_DIR, so 'down'
# still finds the daemons if the variable changed since 'up'.
if ours; then
  conf_state=$(sed -n 's|^StateSaveLocation=\(/.*\)/state$|\1|p' "$ETC/slurm.conf")
  STATE=${conf_state:-$STATE}
fi

# --- processes we started: one pid file per daemon in $STATE/pids ------------------------
# A zombie counts as gone (a container's pid 1 may never reap it).
running() { local p; for p; do grep -qs '^State:[[:space:]]*[^Z]' "/proc/$p/status" && return 0; done; return 1; }
# A pid counts as ours only while its process name still matches, so a recycled pid is
# never signalled.
alive() {  # alive PIDFILE: slurmd-n1.pid must be a running "slurmd", and so on
  local pid name; pid=$(cat "$1" 2>/dev/null) || return 1
  name=$(basename "$1" .pid); name=${name%%-*}
  [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] && running "$pid"
}
all_alive() {
  local f; [[ -e $STATE/pids/slurmctld.pid ]] || return 1
  for f in "$STATE"/pids/*.pid; do alive "$f" || return 1; done
}

stop_daemons() {  # SIGTERM, then SIGKILL whatever still runs after ~5 s
  local f p pids=()
  for f in "$STATE"/pids/*.pid; do
    if alive "$f"; then pids+=("$(cat "$f")"); fi
  done
  if ((${#pids[@]})); then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in {1..25}; do running "${pids[@]}" || break; sleep 0.2; done
    for p in "${pids[@]}"; do if running "$p"; then kill -KILL "$p" 2>/dev/null || true; fi; done
  fi
  rm -f "$STATE"/pids/*.pid
}

nodes_ok() {  # there are nodes and every one is idle, mixed or allocated
  local states; states=$(sinfo -h -N -o %T 2>/dev/null) || return 1
  [[ -n $states ]] && ! grep -qvxE 'idle|mixed|allocated' <<<"$states"
}

# /etc/hosts is rewritten in place, not with sed -i: in containers it is a bind mount whose
# inode cannot be replaced.
hosts_remove() {
  grep -qF "$HOSTS_TAG" /etc/hosts || return 0
  local rest; rest=$(grep -vF "$HOSTS_TAG" /etc/hosts || true)
  printf '%s\n' "$rest" > /etc/hosts
}

log_tails() {  # each daemon's log file, else its stderr (.out); minus the pmix noise
  local f
  for f in "$STATE"/log/*.out; do
    [[ -e $f && $f != */apt.out ]] || continue
    [[ -s ${f%.out}.log ]] && f=${f%.out}.log
    echo "----- $f" >&2; grep -v 'pmix\|MPI: Cannot create context' "$f" | tail -n 12 >&2 || true
  done
}

# Undo 'up': our jobs, our daemons, the hosts line, our /etc/slurm files (restoring a backup).
teardown() {
  # Cancel the jobs of our cluster only: their slurmstepd would outlive slurmd otherwise.
  if ours && alive "$STATE/pids/slurmctld.pid"; then
    local jobs; jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for _ in {1..20}; do pgrep -x slurmstepd >/dev/null || break; sleep 0.5; done
    fi
  fi
  stop_daemons
  if pgrep -x slurmstepd >/dev/null; then
    say "warning: slurmstepd still running: $(pgrep -x slurmstepd | tr '\n' ' ')"
  fi
  hosts_remove
  # the nodes' network, once nothing runs inside it (netns.sh refuses otherwise)
  if ip netns list 2>/dev/null | grep -q '^ddpscale-'; then
    "${NETNS[@]}" down >/dev/null || say "warning: the node network stays up ('netns.sh down' says why)"
  fi
  local f; for f in "${OUR_FILES[@]}"; do
    if ours "$f"; then rm -f "$ETC/$f"; fi
    if [[ -f $STATE/backup/$f ]]; then mv "$STATE/backup/$f" "$ETC/$f"; say "restored $ETC/$f"; fi
  done
}

# A failed 'up' leaves nothing running and nothing of ours in /etc; the logs stay.
fail() { log_tails; teardown >/dev/null 2>&1 || true; die "$*"; }

# --- up ----------------------------------------------------------------------------------
install_packages() {
  # Not the slurm-wlm metapackage, no recommends: 8 packages instead of ~43 (its extra
  # plugins: hdf5, influxdb, rocm-smi, ... are not needed here).
  local c missing=0 t0=$SECONDS pkgs=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server iproute2)
  for c in slurmctld slurmd sbatch munged slurmdbd mariadbd ip tc; do command -v "$c" >/dev/null || missing=1; done
  ((missing)) || return 0
  say "installing ${pkgs[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  # one install at a time with the other tests' (tests/helpers/system_tools.py: APT_LOCK)
  exec 9>/var/lock/ddpscale-apt.lock && flock 9
  local apt=(apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${pkgs[@]}")
  "${apt[@]}" >"$STATE/log/apt.out" 2>&1 ||           # the package lists may be stale or absent
    { apt-get -o DPkg::Lock::Timeout=600 update -q && "${apt[@]}"; } >>"$STATE/log/apt.out" 2>&1 ||
    { tail -n 15 "$STATE/log/apt.out" >&2; die "apt-get install failed (log: $STATE/log/apt.out)"; }
  exec 9>&-
  say "installed in $((SECONDS - t0)) s"
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  munge_works && return 0             # a munged already runs (not ours): use it, never stop it
  [[ -s /etc/munge/munge.key ]] || mungekey --create >/dev/null 2>&1 ||
    fail "no /etc/munge/munge.key and mungekey --create failed"
  install -d -o munge -g munge -m 0755 /run/munge    # without systemd nobody creates it
  # setpriv execs (no fork), so $! is munged itself; -F keeps it in the foreground.
  setsid setpriv --reuid=munge --regid=munge --init-groups munged -F \
    >"$STATE/log/munged.out" 2>&1 </dev/null &
  echo $! > "$STATE/pids/munged.pid"
  for _ in {1..25}; do munge_works && return 0; sleep 0.2; done
  fail "munged did not start (munge -n | unmunge fails)"
}

cmd_up() {
  while (($#)); do
    case $1 in
      --nodes) NODES=${2:?}; shift 2 ;;
      --gpus-per-node) GPUS=${2:?}; shift 2 ;;
      --cpus-per-node) CPUS=${2:?}; shift 2 ;;
      --rate) RATE=${2:?}; shift 2 ;;
      --no-network) NETWORK=0; shift ;;
      --force) FORCE=1; shift ;;
      *) die "unknown option for up: $1" ;;
    esac
  done
  [[ $NODES =~ ^[1-9][0-9]?$ && $GPUS =~ ^[0-9]+$ && $CPUS =~ ^[1-9][0-9]*$ ]] ||
    die "--nodes must be 1-99, --gpus-per-node >= 0, --cpus-per-node >= 1"
  ((EUID == 0)) || die "must run as root (it installs packages, writes /etc/slurm and /etc/hosts)"
  [[ $STATE == /* && $STATE != *[[:space:]]* ]] || die "DDPSCALE_SLURM_DIR must be an absolute path without spaces"
  local want="nodes=$NODES gpus=$GPUS cpus=$CPUS network=$( ((NETWORK)) && echo "$RATE" || echo none)" f i

  # Already up and healthy with the same shape: nothing to do. Another shape: refuse.
  if ours && all_alive && nodes_ok; then
    local have; have=$(cat "$STATE/params" 2>/dev/null || true)
    [[ $have == "$want" ]] || die "already up with $have; run 'down' first to get $want"
    say "already up and healthy ($have)"; sinfo -N -o "%N %P %T %G %c %m %f"; return 0
  fi

  if [[ -d $STATE && ! -e $STATE/.ddpscale-minicluster && -n $(ls -A "$STATE") ]]; then
    die "$STATE exists and is not ours; set DDPSCALE_SLURM_DIR to another folder"
  fi
  mkdir -p "$STATE"/{pids,run,log,state,spool,backup}
  rm -f "$STATE"/log/*.log "$STATE"/log/*.out   # slurm appends; tails should show this run
  touch "$STATE/.ddpscale-minicluster"      # lets 'down --purge' know the folder is ours
  stop_daemons                              # leftovers of a half-dead earlier 'up'
  for f in slurmctld slurmd slurmdbd; do
    if pgrep -x "$f" >/dev/null; then die "a $f not started by this script is running; stop it first"; fi
  done
  # Someone's real SLURM config: keep away unless --force, then keep it for 'down'.
  for f in "${OUR_FILES[@]}"; do
    if [[ -f $ETC/$f ]] && ! ours "$f"; then
      ((FORCE)) || die "$ETC/$f exists and is not ours; rerun with --force to back it up and replace it"
      mv "$ETC/$f" "$STATE/backup/$f"; say "moved your $ETC/$f to $STATE/backup ('down' restores it)"
    fi
  done

  install_packages
  local t0; t0=$(date +%s%N)
  if ((NETWORK)); then
    "${NETNS[@]}" up --nodes "$NODES" --rate "$RATE" >"$STATE/log/netns.out" 2>&1 ||
      fail "the node network did not come up: $(tail -n1 "$STATE/log/netns.out") (or 'up --no-network': every node on 127.0.0.1)"
  fi
  start_munge
  write_config
  echo "$want" > "$STATE/params"
  hosts_remove    # Lightning's MASTER_ADDR is the first node's name, so n1..nN must resolve
  for ((i = 1; i <= NODES; i++)); do echo "$(node_addr "$i") n$i $HOSTS_TAG"; done >> /etc/hosts
  echo "127.0.0.1 $(site_node_names)$HOSTS_TAG" >> /etc/hosts

  # accounting first: slurmctld loads the associations it enforces from slurmdbd at start
  start_mariadb
  start_slurmdbd
  add_associations

  # -D: stay in the foreground so $! is the daemon; -c: forget the jobs of an earlier run.
  setsid slurmctld -D -c >"$STATE/log/slurmctld.out" 2>&1 </dev/null &
  echo $! > "$STATE/pids/slurmctld.pid"
  for ((i = 1; i <= NODES; i++)); do
    if ((NETWORK)); then
      # its own network namespace (plain nsenter: see netns.sh) and its own hostname (a UTS
      # namespace), each exec'd in turn, so the pid ends up being slurmd's
      setsid nsenter --net="/run/netns/ddpscale-n$i" -- unshare --uts -- \
        sh -c 'hostname "$1" && exec slurmd -D -N "$1"' sh "n$i" >"$STATE/log/slurmd-n$i.out" 2>&1 </dev/null &
    else
      setsid slurmd -D -N "n$i" >"$STATE/log/slurmd-n$i.out" 2>&1 </dev/null &
    fi
    echo $! > "$STATE/pids/slurmd-n$i.pid"
  done
  for f in $(site_node_names); do
    setsid slurmd -D -N "$f" >"$STATE/log/slurmd-$f.out" 2>&1 </dev/null &
    echo $! > "$STATE/pids/slurmd-$f.pid"
  done
  # until each start chain (nsenter, unshare, sh) has exec'd the daemon, its pid is not "slurmd" yet
  for f in "$STATE"/pids/slurmd-*.pid; do
    for _ in {1..50}; do
      [[ $(cat "/proc/$(cat "$f")/comm" 2>/dev/null) == slurmd ]] || ! running "$(cat "$f")" && break
      sleep 0.1
    done
  done

  for _ in {1..60}; do                      # ~30 s for every node to report idle
    for f in "$STATE"/pids/*.pid; do
      alive "$f" || fail "$(basename "$f" .pid) exited right after start"
    done
    if nodes_ok; then
      say "up in $((($(date +%s%N) - t0) / 1000000)) ms: $NODES nodes x $GPUS GPUs x $CPUS CPUs in partition debug$( ((NETWORK)) && echo " on a $RATE network (ib0)"), site partitions, accounting"
      sinfo -N -o "%N %P %T %G %c %m %f"; return 0
    fi
    sleep 0.5
  done
  sinfo -N -o "%N %P %T %G %c %m %f" >&2 || true
  fail "nodes not idle within 30 s"
}

# --- down / status -----------------------------------------------------------------------
cmd_down() {
  case ${1:-} in --purge) PURGE=1 ;; "") ;; *) die "unknown option for down: $1" ;; esac
  ((EUID == 0)) || die "must run as root"
  teardown
  if ((PURGE)) && [[ -e $STATE/.ddpscale-minicluster ]]; then
    rm -rf "$STATE"; say "down; removed $STATE"
  else
    say "down; logs kept in $STATE/log"
  fi
}

cmd_status() {
  local f rc=0
  ours || { echo "not up: $ETC/slurm.conf is not ours"; return 1; }
  sinfo -N -o "%N %P %T %G %c %m %f" || rc=1
  for f in "$STATE"/pids/*.pid; do
    [[ -e $f ]] || continue
    if alive "$f"; then echo "$(basename "$f" .pid): running (pid $(cat "$f"))"
    else echo "$(basename "$f" .pid): NOT running"; rc=1; fi
  done
  nodes_ok || rc=1
  return $rc
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) cmd_status ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
