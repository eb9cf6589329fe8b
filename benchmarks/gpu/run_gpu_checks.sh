#!/usr/bin/env bash
# Prepared passes over the GPU-only paths, each sized for one call of a lent machine (one H200; 15 minutes of
# device time per lease, machine starts included; nothing can be downloaded there). A pass is a group of steps
# whose budgets (and nvidia-smi's) sum to <= 360 s: the default `check` pass plus a 1-2 minute machine start leave
# room for a rerun or for a second group on the still-warm machine (`--group perf` or `--group study`). Every step
# is time-boxed (`timeout -k`: SIGTERM at its budget minus a grace, SIGKILL at its budget) and later steps run
# whatever an earlier one did.
#
# The check runs the project as users install it: the install step puts the carried wheels (.whl/: megatron-core,
# the project's own wheel, and whatever else prepare_wheels.sh carries) into a private site dir, the only entry of
# PYTHONPATH, and every step runs as a module from a scratch copy of benchmarks/, pretrain/ and configs/, so
# nothing imports the checkout as a package. `install` runs on every call (--steps adds it): each call has a new
# work dir, so a rerun installs again.
#
# It always returns what it measured: after every step $OUT/steps.log, $OUT/summary.json (every planned step
# with its status) and $OUT/details.tar.gz (every step's log and JSON) are rewritten, and an EXIT trap writes
# them once more whatever ends the script (a signal, an error, the end). Benchmarks write their JSON after
# every variant and the training steps each run's record as it ends; a trainer's figures come from its per-step
# metrics (warm-up steps excluded). $OUT is the folder the device tool returns (set there); unset, results go to
# results/gpu.
#
#   bash benchmarks/gpu/prepare_wheels.sh                 # here, first: megatron-core + the project -> .whl/
#   bash benchmarks/gpu/run_gpu_checks.sh                 # on the GPU machine, the check pass (carry .whl;
#                                                         #   a command timeout of 420 s: 360 s of budgets + slack)
#   bash benchmarks/gpu/run_gpu_checks.sh --group perf    # the lever matrix (a second call, same lease)
#   bash benchmarks/gpu/run_gpu_checks.sh --steps study   # the study alone (as above)
#   bash benchmarks/gpu/run_gpu_checks.sh --steps train,peer   # a rerun of some steps (+ install, summary)
#   make gpu-dry-run OUT=DIR [STEPS=a,b] [GROUP=g]        # here: the steps at tiny sizes on CPU, in an env with
#                                                         #   only the GPU image's packages (the same install step)
#
# Steps by group (budget in s; docs/gpu-check.md's table is tested against these lines):
#   check (the default):
#   install        30  every carried wheel into a private site dir; every module a step imports is imported and
#                      must come from there (a cold machine took 15 s)
#   compat         30  the compat layer on CUDA: no CPU patch; the torch-fallback fixes (no Apex/TE in the image)
#   kernel_check   60  fused copy kernels vs the PyTorch reference at T=4096 (bf16, fp32, FP8; d 64/128; 9 cases,
#                      each a few cold Triton compiles)
#   kernel_bench   40  copy kernels at T = 4k/16k/32k, d=64, and 8k/16k at d=128: fused vs SDPA flash vs chunked vs
#                      naive, FP8 vs bf16, extra memory (after kernel_check: its compiled kernels are cached)
#   attention      25  benchmarks.attention: document masking by every available backend (flash varlen, nested
#                      jagged, per document) vs the dense-mask reference, seq 8192 / 2048, bf16 (20 s measured)
#   train          75  benchmarks.gpu.train_runs check: in one process, SmolLM2-1.7B at seq 4096 with four
#                      micro-batches of 4 per step and SmolLM2-135M (seq 2048, micro 8), baseline and CPLM with
#                      the recipes' defaults (benchmarks/gpu/runs.py): tokens/s, MFU (full and causal attention
#                      FLOPs), peak memory beside the planner's estimate
#   peer           85  benchmarks.gpu.hf_peer check: transformers' Llama at the 135M shape, eager and
#                      torch.compile (~60 s of compilation)
#   perf:
#   perf_train    230  train_runs.py perf: each lever alone at 135M (model.compile, model.fused_swiglu, the
#                      optimizer's fused step off, the LM-head loss path), all levers at 135M and 1.7B/4k, profiled
#                      steps (kernel launches per step), the earlier chunked-loss rows
#   perf_peer      45  hf_peer.py perf: the peer at the 1.7B seq 4096 shape, four micro-batches per step
#   lm_head_loss   45  benchmarks.lm_head_loss (Megatron's LM-head loss path vs chunked vs fused)
#   study:
#   study         300  benchmarks.gpu.study_step (the installed cplm_megatron.experiments.gpu_study): the code
#                      corpus from the machine's own Python sources, baseline and CPLM trained the same tokens within
#                      the step's budget (probed every N steps), scored with their controls (--budget study=S: a
#                      shorter budget, as benchmarks/gpu/lease.sh gives it)
#   (the lease's parts, benchmarks/gpu/lease.sh, in no group):
#   perf_small    150  train_runs.py perf --slots small: the lever matrix's 135M runs (each lever alone, all levers,
#                      the LM-head loss paths), the most wanted first
#   perf_large    150  train_runs.py perf --slots large_4k,large: its 1.7B runs (at seq 4096: the recipes'
#                      defaults, all levers, the copy head with them, the fused loss; then seq 2048, chunked loss)
#   every group:
#   summary         5  benchmarks.gpu.gpu_steps summary (no torch) -> $OUT/summary.json
#   (nvidia-smi     4  before the steps, outside the step table)
set -uo pipefail

DRY_RUN=0
ONLY=""
GROUP=""
SHORTER=()
usage() {
  echo "usage: run_gpu_checks.sh [--cpu-dry-run] [--group check|perf|study] [--steps NAME,NAME,...] [--budget NAME=S]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) DRY_RUN=1 ;;
    --budget) [ $# -ge 2 ] || usage; SHORTER+=("$2"); shift ;;
    --steps) [ $# -ge 2 ] || usage; ONLY=$2; shift ;;
    --steps=*) ONLY=${1#--steps=} ;;
    --group) [ $# -ge 2 ] || usage; GROUP=$2; shift ;;
    --group=*) GROUP=${1#--group=} ;;
    *) usage ;;
  esac
  shift
done
if [ -n "$ONLY" ] && [ -n "$GROUP" ]; then echo "--steps and --group: give one" >&2; exit 2; fi

cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
ORDER=(install compat kernel_check kernel_bench attention train perf_small peer perf_train perf_peer lm_head_loss study
       perf_large summary)
declare -A BUDGET=([install]=30 [compat]=30 [kernel_check]=60 [kernel_bench]=40 [attention]=25 [train]=75
                   [peer]=85 [perf_train]=230 [perf_peer]=45 [lm_head_loss]=45 [study]=300 [summary]=5
                   [perf_small]=150 [perf_large]=150)
declare -A STEP_GROUPS=([check]="install compat kernel_check kernel_bench attention train peer summary"
                   [perf]="install perf_train perf_peer lm_head_loss summary"
                   [study]="install study summary")
NVIDIA_SMI_BUDGET=4
BUDGET_LIMIT=360
declare -A SELECTED=()
if [ -n "$ONLY" ]; then
  IFS=, read -r -a wanted <<< "$ONLY"
  for name in "${wanted[@]}"; do
    [ -n "${BUDGET[$name]:-}" ] || { echo "--steps: unknown step '$name'; steps: ${ORDER[*]}" >&2; exit 2; }
    SELECTED[$name]=1
  done
  SELECTED[install]=1  # a new work dir every call: a rerun installs the wheels again
  SELECTED[summary]=1
else
  GROUP=${GROUP:-check}
  [ -n "${STEP_GROUPS[$GROUP]:-}" ] || { echo "--group: unknown group '$GROUP'; groups: ${!STEP_GROUPS[*]}" >&2; exit 2; }
  for name in ${STEP_GROUPS[$GROUP]}; do SELECTED[$name]=1; done
fi
for item in "${SHORTER[@]}"; do  # --budget NAME=S: a step's budget lowered (never raised) for this call
  name=${item%%=*}
  seconds=${item#*=}
  [ -n "${BUDGET[$name]:-}" ] && [[ "$seconds" =~ ^[0-9]+$ ]] && [ "$seconds" -le "${BUDGET[$name]}" ] \
    && [ "$seconds" -gt 5 ] || { echo "--budget $item: a step's budget lowered to 6..${BUDGET[$name]:-?} s" >&2; exit 2; }
  BUDGET[$name]=$seconds
done
TOTAL=$NVIDIA_SMI_BUDGET
for name in "${ORDER[@]}"; do
  if [ -n "${SELECTED[$name]:-}" ]; then TOTAL=$((TOTAL + BUDGET[$name])); fi
done
if [ "$TOTAL" -gt "$BUDGET_LIMIT" ]; then
  echo "the selected steps' budgets sum to ${TOTAL}s > ${BUDGET_LIMIT}s: select fewer (--steps) for one call" >&2
  exit 2
fi

OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/steps.log" "$OUT/summary.json" "$OUT/details.tar.gz"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-checks.XXXXXX")
mkdir -p "$WORK/logs"
PY=${PYTHON:-python3}
if [ "$DRY_RUN" = 1 ]; then
  if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
  export CUDA_VISIBLE_DEVICES=""  # the CPU path even where a GPU is visible
  export TRITON_INTERPRET=1  # the Triton kernels (the fused LM-head loss, the copy kernels) in the interpreter
fi
case "$PY" in /*) ;; */*) PY=$ROOT/$PY ;; esac  # the steps run in a scratch copy of the scripts
WHEELS=${WHEEL_DIR:-.whl}
case "$WHEELS" in /*) ;; *) WHEELS=$ROOT/$WHEELS ;; esac
SHARED_SITE=${SITE_DIR:-}  # benchmarks/gpu/lease.sh: one site dir installed once, reused by every later call
if [ -n "$SHARED_SITE" ]; then mkdir -p "$SHARED_SITE" && SHARED_SITE=$(cd "$SHARED_SITE" && pwd); fi
WARMUP_STEPS=$((DRY_RUN ? 1 : 3))  # training figures leave out these first steps (compilation, allocator warm-up)
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # the 1.7B steps: no fragmentation OOM near the peak
# The dry run keeps the budgets it reports but allows each step 10x: CI machines are slow and shared.
TIMEOUT_SCALE=$((DRY_RUN ? 10 : 1))
GRACE=5  # SIGTERM at budget - GRACE (a trainer stops at its next step and writes its record), SIGKILL at budget
for name in "${ORDER[@]}"; do
  if [ -n "${SELECTED[$name]:-}" ]; then printf '%s\t%s\n' "$name" "${BUDGET[$name]}" >> "$WORK/plan.tsv"; fi
done

log() { echo "[gpu-check $(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

SUMMARY_FLAGS=(--budget-limit "$BUDGET_LIMIT" --warmup-steps "$WARMUP_STEPS")
if [ "$DRY_RUN" = 1 ]; then SUMMARY_FLAGS+=(--dry-run); fi
publish() {  # summary.json + details.tar.gz in $OUT from what $WORK holds now (the summary imports no torch)
  (cd "$WORK/tree" && timeout -k 2 20 "$PY" -m benchmarks.gpu.gpu_steps summary "$WORK" "$OUT/summary.json" \
    "${SUMMARY_FLAGS[@]}") > "$WORK/logs/summary_refresh.log" 2>&1
  cp "$OUT/steps.log" "$WORK/steps.log" 2>/dev/null
  if tar -czf "$OUT/details.tar.gz.tmp" -C "$WORK" --exclude=runs --exclude=site --exclude=tree --exclude=block .; then
    mv -f "$OUT/details.tar.gz.tmp" "$OUT/details.tar.gz"
  else
    rm -f "$OUT/details.tar.gz.tmp"  # tar stopped (a signal to the group): the previous tarball stays
  fi
}

CURRENT=""       # the step running now (recorded as interrupted if the script ends during it)
CURRENT_PID=""
FINISHED=0
# shellcheck disable=SC2329  # invoked by the EXIT trap
finish() {  # EXIT trap: whatever ended the script, the summary and the tarball are written
  local rc=$?
  trap - EXIT TERM INT HUP
  if [ -n "$CURRENT" ]; then
    printf '%s\t%s\t%s\t%s\n' "$CURRENT" "${BUDGET[$CURRENT]}" interrupted "$((SECONDS - CURRENT_T0))" >> "$WORK/steps.tsv"
    log "script ended during $CURRENT (recorded as interrupted)"
  fi
  publish
  log "summary: $OUT/summary.json, details: $OUT/details.tar.gz (${SECONDS}s)"
  rm -rf "$WORK"
  if [ "$FINISHED" = 1 ]; then exit "$RESULT"; fi
  exit $((rc ? rc : 1))
}
# shellcheck disable=SC2329  # invoked by the signal traps
on_signal() {  # stop the running step (its timeout forwards SIGTERM; SIGKILL after the grace), then exit
  log "received $1: stopping"
  if [ -n "$CURRENT_PID" ] && kill -0 "$CURRENT_PID" 2>/dev/null; then
    kill -TERM "$CURRENT_PID" 2>/dev/null
    for _ in $(seq $((GRACE * 10))); do kill -0 "$CURRENT_PID" 2>/dev/null || break; sleep 0.1; done
    pkill -KILL -P "$CURRENT_PID" 2>/dev/null
    kill -KILL "$CURRENT_PID" 2>/dev/null
  fi
  exit 143
}
trap finish EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

step() {  # step NAME CMD...: run CMD within NAME's budget (log: $WORK/logs/NAME.log), record it, publish
  local name=$1 rc limit
  shift
  if [ -z "${SELECTED[$name]:-}" ]; then return 0; fi
  limit=$((BUDGET[$name] * TIMEOUT_SCALE))
  CURRENT=$name
  CURRENT_T0=$SECONDS
  timeout -k "$GRACE" "$((limit - GRACE))" "$@" > "$WORK/logs/$name.log" 2>&1 &
  CURRENT_PID=$!
  log "start $name (budget ${BUDGET[$name]}s, pid $CURRENT_PID)"
  wait "$CURRENT_PID"
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "${BUDGET[$name]}" "$rc" "$((SECONDS - CURRENT_T0))" >> "$WORK/steps.tsv"
  CURRENT=""
  CURRENT_PID=""
  log "end $name rc=$rc in $((SECONDS - CURRENT_T0))s"
  tail -n 15 "$WORK/logs/$name.log"
  [ "$name" = summary ] || publish
}

# The project as users install it: the carried wheels in $WORK/site (the install step), the only PYTHONPATH entry;
# the steps run as modules (python -m benchmarks.NAME) from $WORK/tree, a copy of the benchmarks, scripts and
# recipes without the project's packages: the tree goes first on sys.path, and cplm_megatron and cplm_kernels still
# come from the site dir (the install check fails for a module from anywhere else).
if [ -n "$SHARED_SITE" ]; then ln -s "$SHARED_SITE" "$WORK/site"; else mkdir -p "$WORK/site"; fi
mkdir -p "$WORK/tree"
cp -r benchmarks pretrain configs "$WORK/tree/"
export PYTHONPATH="$WORK/site" PYTHONNOUSERSITE=1
STUDY_PYTHONPATH=$PYTHONPATH  # the study trains on real shards: it imports the carried mosaicml-streaming
if [ "$DRY_RUN" = 1 ]; then
  # The check and perf steps train on synthetic data and must not need mosaicml-streaming (only the study step
  # uses it, from the carried wheels): the dry run blocks it for them.
  mkdir -p "$WORK/block/streaming"
  echo 'raise ImportError("only the study step may import mosaicml-streaming (carried for it alone)")' \
    > "$WORK/block/streaming/__init__.py"
  export PYTHONPATH="$WORK/block:$PYTHONPATH"
fi
cd "$WORK/tree" || exit 2

# shellcheck disable=SC2329  # run by `step install` through bash -c (timeout needs a command)
install_wheels() {
  local mcore=("$WHEELS"/megatron_core-*.whl) project=("$WHEELS"/cplm_megatron-*.whl) wheels=("$WHEELS"/*.whl)
  if [ -e "$WORK/site/.installed" ] && [ -e "$WORK/site/env.json" ]; then  # a shared site an earlier call installed
    echo "reusing the site dir installed by an earlier call: $(readlink -f "$WORK/site")"
    cp "$WORK/site/env.json" "$WORK/env.json"
    return 0
  fi
  if [ ! -e "${mcore[0]}" ] || [ ! -e "${project[0]}" ]; then
    echo "error: $WHEELS lacks the megatron-core or the project wheel: run bash benchmarks/gpu/prepare_wheels.sh" \
      "here first and carry .whl"
    return 2
  fi
  echo "installing ${wheels[*]##*/} into $WORK/site"
  # --ignore-requires-python: the dry run installs megatron-core 0.19.2's cp311 wheel (its metadata asks for 3.12)
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --ignore-requires-python --upgrade --target "$WORK/site" "${wheels[@]}" || return 1
  "$PY" -m benchmarks.gpu.gpu_steps install-check "$WORK" || return 1
  cp "$WORK/env.json" "$WORK/site/env.json" && touch "$WORK/site/.installed"
}

log "$([ "$DRY_RUN" = 1 ] && echo "CPU DRY RUN (tiny sizes, not a measurement)" || echo "GPU checks"); budgets ${TOTAL}s; \
steps: $(cut -f1 "$WORK/plan.tsv" | paste -sd,); python $PY; wheels $WHEELS; work dir $WORK"
{ timeout -k 1 "$NVIDIA_SMI_BUDGET" nvidia-smi || echo "no nvidia-smi (or it took over ${NVIDIA_SMI_BUDGET}s)"; } \
  > "$WORK/logs/nvidia-smi.log" 2>&1

export -f install_wheels
export PY DRY_RUN WORK WHEELS
step install bash -c install_wheels
step compat "$PY" -m benchmarks.gpu.gpu_steps compat "$WORK"
DRY=()  # the Python steps' tiny-size flag in the dry run
if [ "$DRY_RUN" = 1 ]; then DRY=(--dry-run); fi
if [ "$DRY_RUN" = 1 ]; then
  step kernel_check "$PY" -m benchmarks.gpu_kernel_check --tiny --json "$WORK/kernel_check.json"
  step kernel_bench "$PY" -m benchmarks.copy_kernel --gpu-row-set --seq-lens 32 64 --head-dims 32 \
    --json "$WORK/copy_kernel.json"
  step attention "$PY" -m benchmarks.attention --quick --json "$WORK/attention.json"
else
  step kernel_check "$PY" -m benchmarks.gpu_kernel_check --json "$WORK/kernel_check.json"
  step kernel_bench "$PY" -m benchmarks.copy_kernel --seq-lens 4096 16384 32768 --head-dims 64 \
    --json "$WORK/copy_kernel.json"
  step attention "$PY" -m benchmarks.attention --json "$WORK/attention.json"
fi
step train "$PY" -m benchmarks.gpu.train_runs "$WORK" check "${DRY[@]}"
step perf_small "$PY" -m benchmarks.gpu.train_runs "$WORK" perf --slots small "${DRY[@]}"
step peer "$PY" -m benchmarks.gpu.hf_peer "$WORK" check "${DRY[@]}"
step perf_train "$PY" -m benchmarks.gpu.train_runs "$WORK" perf "${DRY[@]}"
step perf_peer "$PY" -m benchmarks.gpu.hf_peer "$WORK" perf "${DRY[@]}"
LM_HEAD_ARGS=(--json "$WORK/lm_head_loss.json")
if [ "$DRY_RUN" = 1 ]; then LM_HEAD_ARGS+=(--quick); fi
step lm_head_loss "$PY" -m benchmarks.lm_head_loss "${LM_HEAD_ARGS[@]}"
STUDY_ARGS=(--budget $((BUDGET[study] * TIMEOUT_SCALE - GRACE - 5)))  # its scoring ends before the step's SIGTERM
if [ "$DRY_RUN" = 1 ]; then STUDY_ARGS+=(--tiny); fi
step study env PYTHONPATH="$STUDY_PYTHONPATH" "$PY" -m benchmarks.gpu.study_step "$WORK" "${STUDY_ARGS[@]}"
step perf_large "$PY" -m benchmarks.gpu.train_runs "$WORK" perf --slots large_4k,large "${DRY[@]}"

step summary "$PY" -m benchmarks.gpu.gpu_steps summary "$WORK" "$OUT/summary.json" "${SUMMARY_FLAGS[@]}"
RESULT=$(awk -F'\t' '$3 != 0 { bad = 1 } END { print bad + 0 }' "$WORK/steps.tsv")
FINISHED=1
log "done in ${SECONDS}s"
exit "$RESULT"
