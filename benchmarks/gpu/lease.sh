#!/usr/bin/env bash
# One lease of the GPU machine in one command (a lease: 15 minutes of device time, start-up included, at most
# 10 minutes a command; one H200 141GB, or an H100 80GB). Its parts run in order, each one call of
# run_gpu_checks.sh (its steps, budgets, install step and summary) under its own `timeout`, into its own folder
# of $OUT; the carried wheels are installed once, into a site dir every later part reuses.
#
#   bash benchmarks/gpu/lease.sh            # the lease's command, <= 570 s (a command timeout of 600):
#       install   the carried wheels (.whl) into the shared site dir, checked
#       kernel    kernel_check, kernel_bench: the copy kernels against the reference, and their speed
#       perf      perf_small, peer: the levers at 135M (each alone, all together, the LM-head loss paths), then the
#                 transformers peer eager and under torch.compile; the most wanted first
#       study     study (a 200 s budget): where in-context copying emerges, baseline vs CPLM, the same tokens
#       large     perf_large: the 1.7B runs (seq 4096, then 2048), in whatever time is left
#   bash benchmarks/gpu/lease.sh --rest     # the rest of a lease, <= 240 s: compat and the check's training runs
#                                           # (135M, 1.7B/4k, the recipes' defaults), then document-masked attention,
#                                           # the 1.7B/4k peer and the LM-head loss benchmark
#   bash benchmarks/gpu/lease.sh --parts study,large   # some parts of the command again (install is added)
#   make gpu-dry-run OUT=DIR LEASE=first|rest          # here: the same on CPU at tiny sizes (each limit x10)
#
# What comes back: $OUT/lease_summary.json (every part with its status and steps, where the lease stopped, and the
# headline figures of each finished part), $OUT/lease.log, and each part's own summary.json, steps.log and
# details.tar.gz in $OUT/<n>_<part>/. The top-level summary is rewritten before each part starts (naming it as
# running: a lease killed outright still says where it stopped) and after it ends; a part stopped by its timeout
# leaves what it finished (run_gpu_checks.sh rewrites its summary after every step and from its EXIT trap); a
# signal to this script stops the running part the same way and records where.
set -uo pipefail

DRY_RUN=0
COMMAND=first
ONLY=""
usage() { echo "usage: lease.sh [--cpu-dry-run] [--rest] [--parts NAME,NAME]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) DRY_RUN=1 ;;
    --rest) COMMAND=rest ;;
    --parts) [ $# -ge 2 ] || usage; ONLY=$2; shift ;;
    *) usage ;;
  esac
  shift
done

cd "$(dirname "$0")/../.." || exit 2  # the checkout's root: the lease summary runs from here as a module
# part: the steps of its run_gpu_checks.sh call, and its budget overrides ("-": none)
declare -A STEPS=([install]="install" [kernel]="kernel_check,kernel_bench" [perf]="perf_small,peer" [study]="study"
                  [large]="perf_large" [compat_train]="compat,train" [peer_loss]="perf_peer,lm_head_loss,attention")
declare -A SHORTER=([study]="study=200")
declare -A PARTS_OF=([first]="install kernel perf study large" [rest]="install compat_train peer_loss")
declare -A LIMIT_OF=([first]=570 [rest]=240)
# seconds kept, while a part runs, for the parts after it that must run (the study's budget and its call's
# overhead); the last part of the command gets whatever is left
declare -A KEEP=([install]=215 [kernel]=215 [perf]=215)
declare -A MINIMUM=([large]=60)  # a part starts only with this much left (default 20 s): 1.7B runs start slowly
CALL_OVERHEAD=15  # one run_gpu_checks.sh call beyond its steps: nvidia-smi, a reused install, the tree copy, summary
FINAL=5           # for the last summary
LIMIT=${LIMIT_OF[$COMMAND]}
read -r -a PARTS <<< "${PARTS_OF[$COMMAND]}"
if [ -n "$ONLY" ]; then
  IFS=, read -r -a wanted <<< "$ONLY"
  for name in "${wanted[@]}"; do
    [[ " ${PARTS[*]} " == *" $name "* ]] || { echo "--parts: '$name' is not a part of this command: ${PARTS[*]}" >&2; exit 2; }
  done
  keep=(install)
  for name in "${PARTS[@]}"; do [[ ",$ONLY," == *",$name,"* ]] && [ "$name" != install ] && keep+=("$name"); done
  PARTS=("${keep[@]}")
fi

SCALE=$((DRY_RUN ? 10 : 1))  # as run_gpu_checks.sh's dry run: each limit x10 (CI machines are slow and shared)
PY=${PYTHON:-python3}
OUT=${OUT:-results/gpu/lease}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/lease_summary.json" "$OUT/lease.log" "$OUT/lease.tsv" "$OUT"/[0-9]_*
LEASE_WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-lease.XXXXXX")
export SITE_DIR="$LEASE_WORK/site"
CHECKS_ARGS=()
if [ "$DRY_RUN" = 1 ]; then CHECKS_ARGS+=(--cpu-dry-run); fi

log() { echo "[lease $(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/lease.log"; }
SUMMARY_FLAGS=(--command "$COMMAND" --limit "$((LIMIT * SCALE))")
if [ "$DRY_RUN" = 1 ]; then SUMMARY_FLAGS+=(--dry-run); fi
summarize() {  # $OUT/lease_summary.json from lease.tsv and the parts' summaries (no torch)
  timeout -k 2 $((20 * SCALE)) "$PY" -m benchmarks.gpu.gpu_steps lease-summary "$OUT" "${SUMMARY_FLAGS[@]}" \
    >> "$OUT/lease.log" 2>&1 || log "the lease summary failed (see above)"
}

CURRENT=""
CURRENT_PID=""
# shellcheck disable=SC2329  # invoked by the traps
finish() {
  local rc=$?
  trap - EXIT TERM INT HUP
  summarize
  rm -rf "$LEASE_WORK"
  log "lease summary: $OUT/lease_summary.json"
  exit "$rc"
}
# shellcheck disable=SC2329
on_signal() {  # the running part stops as at its timeout (it writes its summary), then the lease records where
  log "received $1 during ${CURRENT:-no part}: stopping"
  printf 'signal\t%s\t%s\t%s\n' "$1" "${CURRENT:--}" "$SECONDS" >> "$OUT/lease.tsv"
  if [ -n "$CURRENT_PID" ] && kill -0 "$CURRENT_PID" 2>/dev/null; then
    kill -TERM "$CURRENT_PID" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$CURRENT_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CURRENT_PID" 2>/dev/null
    rm -f "$folder/details.tar.gz.tmp"  # a tarball the kill cut short (the part's previous one stays)
  fi
  exit 143
}
trap finish EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

kept_after() {  # seconds the parts after $1 must keep (0 when none of them is run)
  local part=$1 later=0 name seen=0
  for name in "${PARTS[@]}"; do
    if [ "$seen" = 1 ] && [ "$name" = study ]; then later=${KEEP[$part]:-0}; fi
    [ "$name" = "$part" ] && seen=1
  done
  echo "$later"
}

log "$([ "$DRY_RUN" = 1 ] && echo "CPU DRY RUN of" || echo "GPU") lease command '$COMMAND' (<= $((LIMIT * SCALE)) s): \
parts ${PARTS[*]}; python $PY; out $OUT"
for name in "${PARTS[@]}"; do printf 'plan\t%s\t%s\n' "$name" "${STEPS[$name]}" >> "$OUT/lease.tsv"; done
summarize
index=0
for name in "${PARTS[@]}"; do
  folder="$OUT/${index}_$name"
  index=$((index + 1))
  left=$(( (LIMIT - FINAL) * SCALE - SECONDS - $(kept_after "$name") * SCALE ))
  if [ "$left" -lt $((${MINIMUM[$name]:-20} * SCALE)) ]; then
    log "skip $name: ${left}s left of the command's $((LIMIT * SCALE))s"
    printf 'skip\t%s\t%s\t%s\n' "$name" "$left" "$SECONDS" >> "$OUT/lease.tsv"
    continue
  fi
  budgets=()
  if [ -n "${SHORTER[$name]:-}" ]; then budgets+=(--budget "${SHORTER[$name]}"); fi
  if [ "$name" = large ]; then  # the 1.7B/4k runs take what is left: their step stops in time, with its records
    budgets+=(--budget "perf_large=$(( left / SCALE - CALL_OVERHEAD > 150 ? 150 : left / SCALE - CALL_OVERHEAD ))")
  fi
  CURRENT=$name
  printf 'start\t%s\t%s\t%s\n' "$name" "$left" "$SECONDS" >> "$OUT/lease.tsv"
  summarize
  log "start $name (steps ${STEPS[$name]}; at most ${left}s) -> $folder"
  start=$SECONDS
  OUT="$folder" timeout -k 10 "$left" bash benchmarks/gpu/run_gpu_checks.sh "${CHECKS_ARGS[@]}" \
    --steps "${STEPS[$name]}" "${budgets[@]}" > "$LEASE_WORK/$name.console" 2>&1 &
  CURRENT_PID=$!
  wait "$CURRENT_PID"
  rc=$?
  CURRENT_PID=""
  CURRENT=""
  rm -f "$folder/details.tar.gz.tmp"  # a part stopped at its timeout's kill (-k) while writing its tarball
  printf 'end\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/lease.tsv"
  tail -n 4 "$LEASE_WORK/$name.console" | sed 's/^/    /'
  log "end $name: exit $rc in $((SECONDS - start))s"
  summarize
  if [ "$name" = install ] && [ "$rc" != 0 ]; then log "the install failed: no part can run"; exit 1; fi
done
printf 'done\t-\t-\t%s\n' "$SECONDS" >> "$OUT/lease.tsv"
log "done in ${SECONDS}s"
awk -F'\t' '$1 == "end" && $3 != 0 { bad = 1 } END { exit bad + 0 }' "$OUT/lease.tsv"
