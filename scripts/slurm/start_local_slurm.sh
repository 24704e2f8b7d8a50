#!/usr/bin/env bash
# Brings up a one-node SLURM cluster on this host for trying and testing scripts/slurm/tptrain.sbatch:
# munged, slurmctld and slurmd on localhost, run as root, no cgroups, no systemd (see
# ../shared/notes/slurm-on-one-host.md). Installs Debian's `slurm-wlm munge` first when missing.
# Idempotent: when its daemons already answer it only prints the settings again.
#
#   source <(bash scripts/slurm/start_local_slurm.sh)   # or: eval "$(bash .../start_local_slurm.sh)"
#   sbatch ...; squeue; ...
#   bash scripts/slurm/stop_local_slurm.sh
#
# stdout: one line `export SLURM_CONF=...` (the commands find the cluster through it); progress and
# errors go to stderr. Environment: TPTRAIN_SLURM_DIR (scratch folder, default /tmp/tptrain-slurm),
# TPTRAIN_SLURM_CPUS (CPUs the node advertises, default 8: slurmd may claim more than the host has).
# Exit status: 0 up; 3 SLURM cannot run here (not root, packages not installable, a daemon does not
# start) -- the reason is on stderr.
set -uo pipefail
DIR=${TPTRAIN_SLURM_DIR:-/tmp/tptrain-slurm}
CPUS=${TPTRAIN_SLURM_CPUS:-8}
CONF=$DIR/slurm.conf
say() { echo "start_local_slurm: $*" >&2; }
die() { say "cannot start SLURM: $*"; exit 3; }

[ "$(id -u)" -eq 0 ] || die "needs root (the daemons run as root here; run it with sudo)"

# --- packages ----------------------------------------------------------------------------------
need=()
for p in slurm-wlm munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  command -v apt-get >/dev/null || die "${need[*]} missing and no apt-get"
  say "installing ${need[*]} (apt-get, --no-install-recommends)"
  t0=$SECONDS
  if ! DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq -o DPkg::Lock::Timeout=60 --no-install-recommends "${need[@]}" \
       > "/tmp/tptrain-slurm-apt.log" 2>&1; then
    timeout 120 apt-get update -qq > /dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq -o DPkg::Lock::Timeout=60 --no-install-recommends "${need[@]}" \
      > "/tmp/tptrain-slurm-apt.log" 2>&1 || die "apt-get install ${need[*]} failed: $(tail -2 /tmp/tptrain-slurm-apt.log)"
  fi
  say "installed in $((SECONDS - t0)) s"
fi
for c in munged munge unmunge slurmctld slurmd sinfo sbatch scontrol; do
  command -v "$c" >/dev/null || die "$c not found after installing slurm-wlm and munge"
done

# --- munge --------------------------------------------------------------------------------------
mkdir -p "$DIR"
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  chmod 700 /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown root:root /etc/munge/munge.key
  fi
  chmod 400 /etc/munge/munge.key
  # munged runs as root here; it insists that its files belong to the user it runs as.
  chown root:root /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
  munged --force > "$DIR/munged.out" 2>&1 || die "munged failed: $(tail -2 "$DIR/munged.out")"
  touch "$DIR/munged.started-by-us"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge 2>&1 | grep -q Success || die "munge -n | unmunge does not say Success"
fi

# --- slurm --------------------------------------------------------------------------------------
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
export SLURM_CONF=$CONF
if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && timeout 10 sinfo -h >/dev/null 2>&1; then
  say "already running (SLURM_CONF=$CONF)"
  echo "export SLURM_CONF=$CONF"
  exit 0
fi
# A half-up cluster from an earlier run: stop what is left, then start afresh.
for d in slurmd slurmctld; do
  if alive "$DIR/$d.pid"; then kill "$(cat "$DIR/$d.pid")"; sleep 1; fi
done
HOST=$(hostname -s)
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
cat > "$CONF" <<CONF
# written by tptrain scripts/slurm/start_local_slurm.sh: a one-node cluster on localhost
ClusterName=tptrain-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
KillWait=30
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:$CPUS
CONF
# -c: start from a clean state (no jobs from an earlier cluster)
slurmctld -c -f "$CONF" > "$DIR/log/slurmctld.out" 2>&1 || die "slurmctld failed: $(tail -3 "$DIR/log/slurmctld.log" 2>/dev/null)"
slurmd -f "$CONF" > "$DIR/log/slurmd.out" 2>&1 || die "slurmd failed: $(tail -3 "$DIR/log/slurmd.log" 2>/dev/null)"
for _ in $(seq 60); do
  state=$(timeout 5 sinfo -h -N -o %t 2>/dev/null | head -1)
  case "$state" in idle|mix|alloc) break;; esac
  sleep 0.5
done
case "$state" in
  idle|mix|alloc) say "up: node $HOST $state, $CPUS CPUs, partition debug (SLURM_CONF=$CONF, logs in $DIR/log)";;
  *) die "node $HOST is '${state:-not reported}' after 30 s; see $DIR/log/slurmctld.log and slurmd.log";;
esac
echo "export SLURM_CONF=$CONF"
