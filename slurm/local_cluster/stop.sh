#!/usr/bin/env bash
# Part of the local SLURM cluster for CI and tests (see slurm/README.md, "Local cluster").
# Tear down the cluster started by start.sh: cancel jobs, then stop daemons by PID file.
# SLURM_CI_KEEP_MUNGE=1 leaves munged running.
set -uo pipefail
ROOT=${SLURM_CI_ROOT:-${TMPDIR:-/tmp}/local-slurm}
log() { echo "[stop_slurm] $*" >&2; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pid() {  # stop_pid PIDFILE
  local pf=$1 pid name
  name=$(basename "$pf" .pid)
  if ! alive "$pf"; then rm -f "$pf"; return 0; fi
  pid=$(cat "$pf"); log "stopping $name ($pid)"
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "$name did not exit, SIGKILL"; kill -KILL "$pid" 2>/dev/null; fi
  rm -f "$pf"
}

# cancel all jobs while the daemons still run, so slurmstepd and job processes are cleaned up
if alive "$ROOT/run/slurmctld.pid"; then
  ids=$(squeue -h -o %A 2>/dev/null | sort -u)
  if [ -n "$ids" ]; then
    log "cancelling jobs: $(echo "$ids" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    scancel $ids 2>/dev/null
    for _ in $(seq 1 60); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi
for pf in "$ROOT"/run/slurmd-*.pid; do [ -e "$pf" ] && stop_pid "$pf"; done
stop_pid "$ROOT/run/slurmctld.pid"
if [ "${SLURM_CI_KEEP_MUNGE:-0}" != 1 ]; then stop_pid "$ROOT/run/munged.pid"; fi
# drop the /etc/hosts lines start_local_slurm.sh added
if grep -q '# slurm-ci$' /etc/hosts; then
  grep -v '# slurm-ci$' /etc/hosts > /etc/hosts.slurm-ci.tmp && cat /etc/hosts.slurm-ci.tmp > /etc/hosts && rm -f /etc/hosts.slurm-ci.tmp
fi
exit 0
