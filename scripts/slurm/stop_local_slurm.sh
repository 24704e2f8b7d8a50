#!/usr/bin/env bash
# Stops the one-node cluster of start_local_slurm.sh: cancels its jobs, then stops slurmd,
# slurmctld and (when start_local_slurm.sh started it) munged by the pids in their pid files.
# Idempotent; always exits 0. Environment: TPTRAIN_SLURM_DIR (default /tmp/tptrain-slurm).
set -uo pipefail
DIR=${TPTRAIN_SLURM_DIR:-/tmp/tptrain-slurm}
export SLURM_CONF=$DIR/slurm.conf
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if alive "$DIR/slurmctld.pid" && [ -n "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]; then
  mapfile -t jobs < <(timeout 5 squeue -h -o %i)
  timeout 10 scancel "${jobs[@]}" 2>/dev/null
  for _ in $(seq 20); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
fi
stop() {  # pidfile
  alive "$1" || return 0
  local pid; pid=$(cat "$1")
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null
}
stop "$DIR/slurmd.pid"
stop "$DIR/slurmctld.pid"
if [ -f "$DIR/munged.started-by-us" ]; then
  stop /run/munge/munged.pid
  rm -f "$DIR/munged.started-by-us"
fi
echo "stop_local_slurm: stopped (scratch folder $DIR kept)" >&2
exit 0
