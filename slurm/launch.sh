#!/usr/bin/env bash
# The launcher every slurm/pretrain_*.sh execs: environment, distributed setup, srun, requeue.
#
#   launch.sh RECIPE [--dry-run] [pretrain_cplm.py arguments...]
#
# RECIPE is relative to the repository root (the working directory of the run). The arguments
# after it go to pretrain/pretrain_cplm.py after `--config RECIPE`, so a later `--config FILE`
# replaces the recipe and `--set key=value ...` overrides apply last.
#
# Inside a SLURM job it runs one training task per GPU as `srun ... & wait` (so traps run while
# the step runs). USR1 (the time-limit warning, `#SBATCH --signal=B:USR1@...`) and TERM reaching
# this shell are forwarded to the step as USR1: the training checkpoints at the next step boundary
# and exits 75 ("resume me"); this script then requeues the job (`scontrol requeue`), and the
# restarted job resumes from the newest complete checkpoint (`latest`, or a checkpoint that committed
# before a crash could move `latest`). Any other exit code ends the job: 2 (refused: bad config, data,
# checkpoint, disk or memory; the run directory is left unchanged, this launcher's log stays in $TMPDIR)
# needs a fix before a resubmission, 1 is a failure. The step's output is teed into a log in $TMPDIR
# and appended to <run.dir>/logs/slurm-<job id>.log once the step was not refused.
#
# Python environment hooks (CPLM_ENV_SETUP combines with the others):
#   CPLM_ENV_SETUP=FILE      bash file sourced first (module loads, exports, your own activation)
#   CPLM_CONTAINER_IMAGE=IMG run the step in a pyxis/enroot container (srun --container-image);
#                            the repository is mounted at its own path and is the working directory;
#                            CPLM_CONTAINER_MOUNTS=src:dst[,src:dst...] adds mounts
#   CPLM_CONDA_ENV=NAME|DIR  `conda activate` it (conda must be on PATH, e.g. via CPLM_ENV_SETUP)
#   CPLM_VENV=DIR            use this virtualenv
#   default                  <repo>/.venv when it exists and no other hook is set, else PATH
#   CPLM_PYTHON=EXE          interpreter to run (default: `python` of the chosen environment)
# Launcher knobs:
#   CPLM_DRY_RUN=1           (or --dry-run first) print the environment and srun command, run nothing
#   CPLM_SRUN_ARGS="..."     extra srun arguments (split on spaces)
#   CPLM_SRUN_WAIT=SEC       once one task exits, kill the rest after SEC seconds (default 600, 0 = never)
#                            so a crashed rank does not leave its peers hanging in a collective
#   CPLM_REQUEUE=0           never requeue (exit 75; resubmit the same command to resume)
#   CPLM_MAX_REQUEUES=N      stop requeueing once the job has restarted N times (default 100)
#   CPLM_MASTER_ADDR/_PORT   rendezvous host/port (default: first host of the allocation,
#                            15000 + job id % 20000; any MASTER_ADDR/PORT from the submitting
#                            shell is ignored so a stale torchrun value cannot break a multi-node job)
# NCCL/CUDA defaults below apply only where the variable is unset: export your own to override.
set -euo pipefail

readonly RESUME_EXIT_CODE=75
readonly USR1_EXIT_CODE=$((128 + 10))  # a task killed by SIGUSR1 (a signal that came before its handler)
REPO=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
RUN_LOG=""          # this launch's log: in $TMPDIR while the step runs, then <run.dir>/logs/slurm-<job id>.log
STOP_SIGNAL=""      # the first stop signal this shell received
STEP_PID=""         # srun's pid while the training step runs
STEP_RC=0           # the training step's exit status

log() {
  local line
  line="[launch $(date +%H:%M:%S)] $*"
  echo "$line" >&2
  if [ -n "$RUN_LOG" ]; then echo "$line" >> "$RUN_LOG"; fi
}

die() {  # die EXIT_CODE MESSAGE...
  local code=$1
  shift
  log "error: $*"
  exit "$code"
}

activate_venv() {
  [ -x "$1/bin/python" ] || die 2 "virtualenv $1 has no bin/python; fix CPLM_VENV or run 'make setup'"
  export VIRTUAL_ENV=$1
  export PATH="$1/bin:$PATH"
  unset PYTHONHOME
}

# Sets PYTHON (and CONTAINER_ARGS for container runs); ENV_DESC describes the choice.
activate_env() {
  CONTAINER_ARGS=()
  if [ -n "${CPLM_ENV_SETUP:-}" ]; then
    [ -f "$CPLM_ENV_SETUP" ] || die 2 "CPLM_ENV_SETUP=$CPLM_ENV_SETUP: no such file"
    set +u
    # shellcheck disable=SC1090
    source "$CPLM_ENV_SETUP"
    set -u
  fi
  if [ -n "${CPLM_CONTAINER_IMAGE:-}" ]; then
    local mounts="$REPO:$REPO"
    if [ -n "${CPLM_CONTAINER_MOUNTS:-}" ]; then mounts="$mounts,$CPLM_CONTAINER_MOUNTS"; fi
    CONTAINER_ARGS=(--container-image="$CPLM_CONTAINER_IMAGE" --container-mounts="$mounts"
                    --container-workdir="$REPO")
    PYTHON=${CPLM_PYTHON:-python}
    ENV_DESC="container $CPLM_CONTAINER_IMAGE"
    return
  fi
  if [ -n "${CPLM_CONDA_ENV:-}" ]; then
    command -v conda >/dev/null || die 2 "CPLM_CONDA_ENV=$CPLM_CONDA_ENV but conda is not on PATH; load it in CPLM_ENV_SETUP"
    set +u
    eval "$(conda shell.bash hook)"
    conda activate "$CPLM_CONDA_ENV"
    set -u
    ENV_DESC="conda env $CPLM_CONDA_ENV"
  elif [ -n "${CPLM_VENV:-}" ]; then
    activate_venv "$CPLM_VENV"
    ENV_DESC="venv $CPLM_VENV"
  elif [ -z "${CPLM_ENV_SETUP:-}" ] && [ -x "$REPO/.venv/bin/python" ]; then
    activate_venv "$REPO/.venv"
    ENV_DESC="venv $REPO/.venv"
  else
    ENV_DESC="PATH${CPLM_ENV_SETUP:+ after sourcing $CPLM_ENV_SETUP}"
  fi
  PYTHON=${CPLM_PYTHON:-$(command -v python || command -v python3 || true)}
  [ -n "$PYTHON" ] || die 2 "no python on PATH; set CPLM_VENV, CPLM_CONDA_ENV or CPLM_ENV_SETUP"
}

# Exports the rendezvous and the NCCL/threading defaults the tasks inherit.
setup_dist_env() {
  local first_host
  if [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    first_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
  else
    first_host=$(hostname -s)
  fi
  export MASTER_ADDR=${CPLM_MASTER_ADDR:-$first_host}
  export MASTER_PORT=${CPLM_MASTER_PORT:-$((15000 + ${SLURM_JOB_ID:-0} % 20000))}
  # torchrun's variables would take precedence over SLURM_PROCID/SLURM_NTASKS in the tasks.
  unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  export PYTHONUNBUFFERED=1
  # Megatron: one CUDA work queue keeps TP/SP communication ordered with the kernels it overlaps.
  export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
  # Abort a rank whose collective failed or timed out instead of hanging the job.
  export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
  # Free NCCL buffers by stream sync instead of recordStream (lower peak memory).
  export TORCH_NCCL_AVOID_RECORD_STREAMS=${TORCH_NCCL_AVOID_RECORD_STREAMS:-1}
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  # Longer InfiniBand retry timeout (2^22 us) rides out transient fabric hiccups on large jobs.
  export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-22}
}

# Prints run.dir of the resolved config (validates the recipe and overrides before any srun step).
resolve_run_dir() {
  local resolved
  local check=("$PYTHON" "${TRAIN_ARGS[@]}" --print-config)
  if [ ${#CONTAINER_ARGS[@]} -gt 0 ]; then
    check=(srun --nodes=1 --ntasks=1 "${CONTAINER_ARGS[@]}" "${check[@]}")
  fi
  resolved=$("${check[@]}") || die 2 "the config did not resolve (recipe $RECIPE, arguments: ${*:-none}); fix the arguments above"
  printf '%s\n' "$resolved" | awk '
    /^run:/ { in_run = 1; next }
    in_run && /^[^ ]/ { exit }
    in_run && /^  dir:/ { sub(/^  dir: */, ""); gsub(/^["\047]|["\047]$/, ""); print; exit }'
}

# shellcheck disable=SC2329  # invoked by the USR1/TERM traps
on_signal() {
  local sig=$1
  if [ -z "$STOP_SIGNAL" ]; then STOP_SIGNAL=$sig; fi
  if [ -n "$STEP_PID" ] && kill -0 "$STEP_PID" 2>/dev/null; then
    log "received SIG$sig: forwarding USR1 to the training step (checkpoint, then exit $RESUME_EXIT_CODE)"
    # srun relays USR1 to every task; TERM would make srun kill the step after KillWait.
    kill -s USR1 "$STEP_PID" 2>/dev/null || true
  else
    log "received SIG$sig before the training step started"
  fi
}

# Appends this launch's log to <run.dir>/logs/ (not after a refusal: the run directory stays as it was).
keep_log() {
  local rc=$1 final="$RUN_DIR/logs/slurm-$SLURM_JOB_ID.log"
  if [ -z "$RUN_LOG" ] || [ "$RUN_LOG" = "$final" ]; then return 0; fi
  if [ "$rc" -eq 2 ]; then
    log "the run directory $RUN_DIR is unchanged; this launch's log: $RUN_LOG"
    return 0
  fi
  if mkdir -p "$RUN_DIR/logs" && cat "$RUN_LOG" >> "$final"; then
    rm -f "$RUN_LOG"
    RUN_LOG=$final
  fi
}

requeue_or_exit() {
  keep_log "$RESUME_EXIT_CODE"
  if [ "${CPLM_REQUEUE:-1}" = 0 ]; then
    log "CPLM_REQUEUE=0: not requeueing; resubmit the same command to resume from the checkpoint"
    exit "$RESUME_EXIT_CODE"
  fi
  local restarts=${SLURM_RESTART_COUNT:-0}
  if [ "$restarts" -ge "${CPLM_MAX_REQUEUES:-100}" ]; then
    log "job restarted $restarts times (CPLM_MAX_REQUEUES=${CPLM_MAX_REQUEUES:-100}): not requeueing again"
    exit "$RESUME_EXIT_CODE"
  fi
  log "requeueing job $SLURM_JOB_ID (restart $((restarts + 1))): it resumes from the newest complete checkpoint in $RUN_DIR/checkpoints"
  if ! scontrol requeue "$SLURM_JOB_ID"; then
    log "error: 'scontrol requeue $SLURM_JOB_ID' failed (job submitted without --requeue, or being cancelled); resubmit the same command to resume"
  fi
  exit "$RESUME_EXIT_CODE"
}

print_dry_run() {
  echo "[dry-run] working directory: $REPO"
  echo "[dry-run] python environment: $ENV_DESC ($PYTHON)"
  echo "[dry-run] run directory: ${RUN_DIR:-<not resolved>} (step output also appended to <run.dir>/logs/slurm-<job id>.log unless the step refuses its input)"
  if [ -z "${SLURM_JOB_ID:-}" ]; then echo "[dry-run] not inside a SLURM job: MASTER_ADDR/PORT are placeholders"; fi
  echo "[dry-run] environment:"
  local var
  for var in MASTER_ADDR MASTER_PORT OMP_NUM_THREADS PYTHONUNBUFFERED CUDA_DEVICE_MAX_CONNECTIONS \
             TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_AVOID_RECORD_STREAMS NCCL_DEBUG NCCL_IB_TIMEOUT \
             SLURM_JOB_ID SLURM_JOB_NODELIST SLURM_NNODES SLURM_NTASKS SLURM_RESTART_COUNT; do
    if [ -n "${!var:-}" ]; then echo "  $var=${!var}"; fi
  done
  echo "[dry-run] command:"
  printf '  '
  printf '%q ' "${STEP_CMD[@]}"
  echo
}

# Sets STEP_CMD: srun running one training task per allocated task slot.
build_step_cmd() {
  local srun_args=(--kill-on-bad-exit=0 --wait="${CPLM_SRUN_WAIT:-600}")
  # srun of SLURM 22.05-23.02 does not inherit --cpus-per-task from the job: pass it on
  if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then srun_args+=(--cpus-per-task="$SLURM_CPUS_PER_TASK"); fi
  srun_args+=("${CONTAINER_ARGS[@]}")
  # shellcheck disable=SC2206  # word splitting is the documented interface of CPLM_SRUN_ARGS
  if [ -n "${CPLM_SRUN_ARGS:-}" ]; then srun_args+=($CPLM_SRUN_ARGS); fi
  STEP_CMD=(srun "${srun_args[@]}" "$PYTHON" -u "${TRAIN_ARGS[@]}")
}

# Runs STEP_CMD in the background (so the traps run), its output teed into RUN_LOG; sets STEP_RC.
run_step() {
  local tee_fd tee_pid final
  exec {tee_fd}> >(tee -a "$RUN_LOG")
  tee_pid=$!
  "${STEP_CMD[@]}" >&"$tee_fd" 2>&1 &
  STEP_PID=$!
  while :; do
    STEP_RC=0
    wait "$STEP_PID" || STEP_RC=$?
    # A trapped signal interrupts `wait` (status > 128) while the step keeps running: wait again.
    if ! kill -0 "$STEP_PID" 2>/dev/null; then break; fi
  done
  final=0
  wait "$STEP_PID" || final=$?  # bash keeps a reaped child's status (older bash: 127, keep the first)
  if [ "$final" -ne 127 ]; then STEP_RC=$final; fi
  STEP_PID=""
  exec {tee_fd}>&-
  wait "$tee_pid" 2>/dev/null || true  # let tee write the step's last lines before the job ends
}

# Ends the job according to the step's exit status: done, requeue, or failure.
finish() {
  local rc=$1
  if [ "$rc" -eq 2 ]; then
    log "training refused its input (exit 2, the error line above names the fix): not requeueing; fix it and resubmit"
    keep_log 2
    exit 2
  fi
  if [ "$rc" -ne "$RESUME_EXIT_CODE" ] && ! { [ -n "$STOP_SIGNAL" ] && [ "$rc" -eq "$USR1_EXIT_CODE" ]; }; then
    keep_log "$rc"
  fi
  if [ "$rc" -eq 0 ]; then
    log "training finished"
    exit 0
  fi
  if [ "$rc" -eq "$RESUME_EXIT_CODE" ]; then
    log "training stopped with a checkpoint (exit $RESUME_EXIT_CODE)"
    requeue_or_exit
  fi
  if [ -n "$STOP_SIGNAL" ] && [ "$rc" -eq "$USR1_EXIT_CODE" ]; then
    log "a task was killed by the forwarded USR1 before its handler was installed: resuming from the last checkpoint"
    requeue_or_exit
  fi
  log "training failed with exit code $rc: not requeueing (see the step output above)"
  exit "$rc"
}

main() {
  [ $# -ge 1 ] || die 2 "usage: launch.sh RECIPE [--dry-run] [pretrain_cplm.py arguments...]"
  RECIPE=$1
  shift
  local dry_run=${CPLM_DRY_RUN:-0}
  if [ "${1:-}" = "--dry-run" ]; then dry_run=1; shift; fi
  cd "$REPO"
  [ -f "$RECIPE" ] || die 2 "recipe $RECIPE not found under $REPO"
  if [ "$dry_run" != 1 ] && [ -z "${SLURM_JOB_ID:-}" ]; then
    die 2 "not inside a SLURM job: submit with sbatch (or set CPLM_DRY_RUN=1 to inspect the launch)"
  fi
  trap 'on_signal USR1' USR1
  trap 'on_signal TERM' TERM

  TRAIN_ARGS=(pretrain/pretrain_cplm.py --config "$RECIPE" "$@")
  activate_env
  setup_dist_env
  RUN_DIR=""
  if [ "$dry_run" = 1 ] && [ ${#CONTAINER_ARGS[@]} -gt 0 ]; then
    log "dry run in a container: config check skipped"
  else
    RUN_DIR=$(resolve_run_dir "$@") || exit 2
    [ -n "$RUN_DIR" ] || die 2 "could not read run.dir from the resolved config"
  fi
  build_step_cmd
  if [ "$dry_run" = 1 ]; then
    print_dry_run
    exit 0
  fi

  RUN_LOG=$(mktemp "${TMPDIR:-/tmp}/cplm-launch-$SLURM_JOB_ID.XXXXXX.log")  # moved into run.dir/logs by keep_log
  log "job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}: ${SLURM_NTASKS:-?} tasks," \
      "rendezvous $MASTER_ADDR:$MASTER_PORT, python from $ENV_DESC, run dir $RUN_DIR"
  if [ -n "$STOP_SIGNAL" ]; then
    log "stop requested (SIG$STOP_SIGNAL) before the training step started"
    requeue_or_exit
  fi
  run_step
  finish "$STEP_RC"
}

main "$@"
