#!/usr/bin/env bash
# local-slurm.sh start|stop|status -- a throwaway single-host SLURM cluster for trying and testing
# `snakemake --profile ...` with the SLURM executor on one workstation (or a CI box). Root only.
#
#   sudo scripts/local-slurm.sh start    # install (if missing), configure, start, wait until idle
#   sudo scripts/local-slurm.sh status   # our daemons, sinfo, squeue (exit 0 running, 3 not)
#   sudo scripts/local-slurm.sh stop     # stop ONLY the daemons this script started
#
# What `start` does (every step is skipped when already done, so it is idempotent):
#   1. apt-get install slurmctld slurmd slurm-client (Debian/Ubuntu; no munge: auth/none),
#      with services kept from auto-starting during the install.
#   2. writes /etc/slurm/slurm.conf and /etc/slurm/gres.conf, but ONLY when they are absent or
#      carry this script's header line; a real cluster's config is never touched (exit 3).
#      The config must live at /etc/slurm: the job-step plugin strips SLURM_CONF from jobs.
#      One node (this host, all its CPUs but at least 8, 90% of its memory, 2 fake GPUs backed by /dev/null-like
#      character devices), one partition `local`, MinJobAge=600 (so `squeue` can serve as the
#      status command; there is no slurmdbd, hence no sacct history).
#   3. starts slurmctld and slurmd as background daemons, records their PIDs in the state dir,
#      and waits until `sinfo` shows the node idle.
# `stop` cancels the jobs left on this cluster, kills only the PIDs recorded by `start` (after
# checking they still are slurmctld/slurmd) and removes the config files only if this script
# wrote them. Packages, logs and the state dir stay.
#
# Environment: LPDL_SLURM_DIR   state dir (default /tmp/lpdl-slurm: pids, logs, spool, fake GPUs)
#              LPDL_SLURM_WAIT  seconds to wait for the node to become idle (default 60)
# Exit codes: 0 ok; 1 failed to start; 2 not root / bad usage; 3 foreign SLURM config or daemons
#             (left alone); 4 packages missing and could not be installed.
set -euo pipefail

STATE=${LPDL_SLURM_DIR:-/tmp/lpdl-slurm}
WAIT=${LPDL_SLURM_WAIT:-60}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
GRES=$CONF_DIR/gres.conf
MARK="# written by lpdl scripts/local-slurm.sh (throwaway single-host cluster; removed by 'stop')"
PARTITION=local

log() { echo "local-slurm: $*" >&2; }
die() { local rc=$1; shift; log "$*"; exit "$rc"; }

ours_conf() { [ -f "$1" ] && head -n 1 "$1" | grep -qxF "$MARK"; }

# pid recorded in $STATE/$1.pid and still a running $1 process
alive() {
  local f="$STATE/$1.pid" pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}

node_state() { sinfo -h -N -o %T 2>/dev/null | head -n 1 | tr -d '[:space:]'; }

wait_idle() {
  local host=$1 deadline=$((SECONDS + WAIT)) st="" resumed=0
  while [ $SECONDS -lt $deadline ]; do
    st=$(node_state)
    case "$st" in
      idle|mixed|allocated) return 0 ;;
      *drain*|*down*|inval*|*fail*)
        if [ $resumed -lt 3 ]; then
          scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
          resumed=$((resumed + 1))
        fi ;;
    esac
    sleep 0.5
  done
  log "node '$host' not idle after ${WAIT}s (state: ${st:-unknown}); logs in $STATE/log"
  tail -n 20 "$STATE"/log/*.log "$STATE"/log/*.out >&2 2>/dev/null || true
  return 1
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
     && command -v squeue >/dev/null && command -v sinfo >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || die 4 "slurm is not installed and apt-get is unavailable"
  log "installing slurmctld slurmd slurm-client (apt-get)"
  local prc=/usr/sbin/policy-rc.d made_prc=0 rc=0
  if [ ! -e $prc ]; then  # keep the packages' services from starting (no config yet)
    printf '#!/bin/sh\nexit 101\n' > $prc && chmod +x $prc && made_prc=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
      slurmctld slurmd slurm-client </dev/null; } >"$STATE/log/apt.log" 2>&1 || rc=$?
  [ $made_prc = 1 ] && rm -f $prc
  if [ $rc -ne 0 ] || ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null; then
    tail -n 20 "$STATE/log/apt.log" >&2 || true
    die 4 "could not install the SLURM packages (see $STATE/log/apt.log)"
  fi
}

write_config() {
  local host=$1 cpus mem
  # at least 8 CPUs declared (slurmd accepts more than it finds: config_overrides), so that a
  # distributed test job of 4 one-CPU tasks fits on a 2-core host; its tasks share the real cores
  cpus=$(nproc); [ "$cpus" -ge 8 ] || cpus=8
  mem=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  [ "${mem:-0}" -ge 500 ] || mem=500
  mkdir -p "$CONF_DIR"
  cat > "$CONF.tmp" <<CONF
$MARK
ClusterName=lpdllocal
SlurmctldHost=$host
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pidfile
SlurmdPidFile=$STATE/slurmd.pidfile
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
SchedulerParameters=sched_interval=5
GresTypes=gpu
NodeName=$host CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  printf '%s\nNodeName=%s Name=gpu File=%s/fakegpu[0-1]\n' "$MARK" "$host" "$STATE" > "$GRES.tmp"
  mv -f "$CONF.tmp" "$CONF"
  mv -f "$GRES.tmp" "$GRES"
}

start() {
  [ "$(id -u)" = 0 ] || die 2 "must run as root (it installs packages and writes $CONF)"
  local host; host=$(hostname -s)
  mkdir -p "$STATE"/{state,spool,log}
  if alive slurmctld && alive slurmd; then
    log "already running (slurmctld $(cat "$STATE/slurmctld.pid"), slurmd $(cat "$STATE/slurmd.pid"))"
    wait_idle "$host" || exit 1
    sinfo
    return 0
  fi
  for f in "$CONF" "$GRES"; do
    if [ -e "$f" ] && ! ours_conf "$f"; then
      die 3 "$f exists and was not written by this script: a real SLURM setup; leaving it alone"
    fi
  done
  install_packages
  # a controller we did not start (another state dir, or the distro service) -> hands off
  if ! alive slurmctld && scontrol ping 2>/dev/null | grep -q ' is UP'; then
    die 3 "a slurmctld not started by this script is answering; leaving it alone"
  fi
  for i in 0 1; do  # fake GPUs: gres needs character devices (same as /dev/null)
    [ -c "$STATE/fakegpu$i" ] || { rm -f "$STATE/fakegpu$i"; mknod "$STATE/fakegpu$i" c 1 3; }
  done
  write_config "$host"
  if ! alive slurmctld; then
    # -c: a clean controller state each time; -D: no forking, so $! is the daemon itself.
    # setsid + redirections: not in the caller's process group, no inherited pipes.
    setsid slurmctld -D -c </dev/null >"$STATE/log/slurmctld.out" 2>&1 &
    echo $! > "$STATE/slurmctld.pid"
  fi
  local deadline=$((SECONDS + WAIT))
  until scontrol ping 2>/dev/null | grep -q ' is UP'; do
    if [ $SECONDS -ge $deadline ] || ! alive slurmctld; then
      tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmctld.out" >&2 2>/dev/null || true
      stop_daemons
      die 1 "slurmctld did not come up"
    fi
    sleep 0.3
  done
  if ! alive slurmd; then
    setsid slurmd -D </dev/null >"$STATE/log/slurmd.out" 2>&1 &
    echo $! > "$STATE/slurmd.pid"
  fi
  if ! wait_idle "$host"; then
    stop_daemons
    die 1 "the node did not become idle"
  fi
  sinfo
}

stop_daemons() {
  local d pid i
  for d in slurmd slurmctld; do
    if alive "$d"; then
      pid=$(cat "$STATE/$d.pid")
      kill -TERM "$pid" 2>/dev/null || true
      for i in $(seq 50); do alive "$d" || break; sleep 0.2; done
      if alive "$d"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; fi
      log "stopped $d ($pid)"
    fi
    rm -f "$STATE/$d.pid"
  done
}

stop() {
  [ "$(id -u)" = 0 ] || die 2 "must run as root"
  # jobs still on OUR cluster are cancelled first (else their job steps outlive slurmd)
  if alive slurmctld && ours_conf "$CONF"; then
    scancel --partition="$PARTITION" >/dev/null 2>&1 || true
    local i
    for i in $(seq 40); do
      [ -z "$(squeue -h -t running,completing -p "$PARTITION" 2>/dev/null)" ] && break
      sleep 0.25
    done
  fi
  stop_daemons
  local f
  for f in "$CONF" "$GRES"; do
    if ours_conf "$f"; then rm -f "$f"; fi
  done
  return 0
}

status() {
  local running=0 d
  for d in slurmctld slurmd; do
    if alive "$d"; then echo "$d: running (pid $(cat "$STATE/$d.pid"), started by this script)"
    else echo "$d: not running (from this script)"; running=3; fi
  done
  if ours_conf "$CONF"; then echo "config: $CONF (written by this script)"
  elif [ -e "$CONF" ]; then echo "config: $CONF (NOT written by this script)"
  else echo "config: none"; fi
  if command -v sinfo >/dev/null && [ $running = 0 ]; then sinfo; squeue; fi
  return $running
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die 2 "usage: $0 start|stop|status" ;;
esac
