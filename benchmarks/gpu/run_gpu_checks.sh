#!/usr/bin/env bash
# One prepared pass over the GPU-only paths, sized for one lease of a lent machine (one H200, 15 minutes of
# device time per task, a machine start included; nothing can be downloaded there). The step budgets sum to
# <= 360 s, so a first pass plus a 1-2 minute machine start leave the 4 minutes a second start needs (a rerun
# of some steps: --steps). Every step is time-boxed (`timeout -k`: SIGTERM at its budget minus a grace, SIGKILL
# at its budget) and later steps run whatever an earlier one did.
#
# It always returns what it measured: after every step $OUT/steps.log, $OUT/summary.json (every planned step
# with its status) and $OUT/details.tar.gz (every step's log and JSON) are rewritten, and an EXIT trap writes
# them once more whatever ends the script (a signal, an error, the end). Benchmarks write their JSON after
# every variant; a trainer stopped at its budget writes its throughput record (summary_stopped_early.json),
# and without one the summary falls back to its metrics.jsonl. Three files, since the device tool brings
# back at most 8.
#
#   bash benchmarks/gpu/prepare_wheels.sh                 # here, first: the wheels the GPU image lacks -> .whl/
#   OUT=DIR bash benchmarks/gpu/run_gpu_checks.sh         # on the GPU machine (device tool: carry .whl)
#   OUT=DIR bash benchmarks/gpu/run_gpu_checks.sh --steps train_large_base,lm_head_loss   # a rerun of some
#   bash benchmarks/gpu/run_gpu_checks.sh --cpu-dry-run   # every step at tiny sizes on CPU (make gpu-dry-run)
#
# Steps (budget in s):
#   install       25  the carried wheels (.whl/: megatron-core) into a private site dir; imports checked
#   compat        20  the compat layer on CUDA: no CPU patch; the torch-fallback fixes (no Apex/TE in the image)
#   kernel_check  40  fused copy kernels vs the PyTorch reference at T=4096 (bf16, fp32, FP8; d 64/128)
#   kernel_bench  45  copy kernels at T = 4k/16k/32k, d=64: fused vs SDPA flash vs chunked vs naive, FP8 vs
#                     bf16, extra memory
#   attention     15  benchmarks/attention.py: document masking per document (flash varlen) vs a dense mask,
#                     seq 8192 / 2048, bf16: time, extra memory, agreement
#   train_*      180  pretrain_cplm.py, bf16, local layer spec with SDPA attention, synthetic data: SmolLM2-135M
#                     (seq 2048, micro 8, 30 steps) and SmolLM2-1.7B (seq 2048, micro 2, 25 steps), baseline and
#                     CPLM: tokens/s, MFU, step time, peak memory (the trainer averages the last 20 steps)
#   lm_head_loss  30  benchmarks/lm_head_loss.py (Megatron's LM-head loss path vs chunked vs fused)
#   summary        5  benchmarks/gpu/gpu_steps.py summary (no torch) -> $OUT/summary.json
set -uo pipefail

DRY_RUN=0
ONLY=""
usage() { echo "usage: run_gpu_checks.sh [--cpu-dry-run] [--steps NAME,NAME,...]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) DRY_RUN=1 ;;
    --steps) [ $# -ge 2 ] || usage; ONLY=$2; shift ;;
    --steps=*) ONLY=${1#--steps=} ;;
    *) usage ;;
  esac
  shift
done

cd "$(dirname "$0")/../.." || exit 2
ORDER=(install compat kernel_check kernel_bench attention train_small_base train_small_cplm train_large_base
       train_large_cplm lm_head_loss summary)
declare -A BUDGET=([install]=25 [compat]=20 [kernel_check]=40 [kernel_bench]=45 [attention]=15 [train_small_base]=35
                   [train_small_cplm]=35 [train_large_base]=55 [train_large_cplm]=55 [lm_head_loss]=30 [summary]=5)
BUDGET_LIMIT=360
TOTAL=0
for name in "${ORDER[@]}"; do TOTAL=$((TOTAL + BUDGET[$name])); done
if [ "$TOTAL" -gt "$BUDGET_LIMIT" ]; then echo "step budgets sum to ${TOTAL}s > ${BUDGET_LIMIT}s" >&2; exit 2; fi
declare -A SELECTED=()
if [ -n "$ONLY" ]; then
  IFS=, read -r -a wanted <<< "$ONLY"
  for name in "${wanted[@]}"; do
    [ -n "${BUDGET[$name]:-}" ] || { echo "--steps: unknown step '$name'; steps: ${ORDER[*]}" >&2; exit 2; }
    SELECTED[$name]=1
  done
  SELECTED[summary]=1
else
  for name in "${ORDER[@]}"; do SELECTED[$name]=1; done
fi

OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/steps.log" "$OUT/summary.json" "$OUT/details.tar.gz"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-checks.XXXXXX")
mkdir -p "$WORK/logs"
PY=${PYTHON:-python3}
if [ "$DRY_RUN" = 1 ]; then
  if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
  export CUDA_VISIBLE_DEVICES=""  # the CPU path even where a GPU is visible
fi
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # the 1.7B steps: no fragmentation OOM near the peak
# The dry run keeps the budgets it reports but allows each step 10x: CI machines are slow and shared.
TIMEOUT_SCALE=$((DRY_RUN ? 10 : 1))
GRACE=5  # SIGTERM at budget - GRACE (a trainer stops at its next step and writes its record), SIGKILL at budget
for name in "${ORDER[@]}"; do
  if [ -n "${SELECTED[$name]:-}" ]; then printf '%s\t%s\n' "$name" "${BUDGET[$name]}" >> "$WORK/plan.tsv"; fi
done

log() { echo "[gpu-check $(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

SUMMARY_FLAGS=()
if [ "$DRY_RUN" = 1 ]; then SUMMARY_FLAGS=(--dry-run); fi
publish() {  # summary.json + details.tar.gz in $OUT from what $WORK holds now (the summary imports no torch)
  timeout -k 2 20 "$PY" benchmarks/gpu/gpu_steps.py summary "$WORK" "$OUT/summary.json" --budget-limit "$BUDGET_LIMIT" \
    "${SUMMARY_FLAGS[@]}" > "$WORK/logs/summary_refresh.log" 2>&1
  cp "$OUT/steps.log" "$WORK/steps.log" 2>/dev/null
  tar -czf "$OUT/details.tar.gz.tmp" -C "$WORK" --exclude=runs --exclude=site --exclude=pkgs --exclude=block . \
    && mv -f "$OUT/details.tar.gz.tmp" "$OUT/details.tar.gz"
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

# The project without installing it: the repository on the path and kernels/ under its import name.
mkdir -p "$WORK/pkgs" "$WORK/site"
ln -s "$PWD/kernels" "$WORK/pkgs/cplm_kernels"
export PYTHONPATH="$WORK/site:$PWD:$WORK/pkgs${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DRY_RUN" = 1 ]; then
  # The GPU image has no mosaicml-streaming and the check does not carry it: the dry run proves no step needs it.
  mkdir -p "$WORK/block/streaming"
  echo 'raise ImportError("mosaicml-streaming is not carried to the GPU machine: the checks must not import it")' \
    > "$WORK/block/streaming/__init__.py"
  export PYTHONPATH="$WORK/block:$PYTHONPATH"
fi

# shellcheck disable=SC2329  # run by `step install` through bash -c (timeout needs a command)
install_wheels() {
  local wheels=(.whl/*.whl)
  if [ "$DRY_RUN" = 1 ]; then
    echo "dry run: this environment's packages (would install: ${wheels[*]})"
  elif [ -e "${wheels[0]}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
      "${wheels[@]}" || return 1
  else
    echo "no .whl/: run benchmarks/gpu/prepare_wheels.sh here first and carry .whl"
  fi
  "$PY" -c "import megatron.core, cplm_kernels, cplm_megatron" && "$PY" benchmarks/gpu/gpu_steps.py env "$WORK"
}

train() {  # train SLOT VARIANT PRESET SEQ MICRO ITERS: one pretrain_cplm.py run on synthetic data
  local variant=$2 preset=$3 seq=$4 micro=$5 iters=$6 run="$WORK/runs/$1_$2" name="train_$1_$2"
  if [ -z "${SELECTED[$name]:-}" ]; then return 0; fi
  step "$name" "$PY" pretrain/pretrain_cplm.py --config configs/smollm2_135m.yaml --set \
    run.dir="$run" model.preset="$preset" model.attention_impl=sdpa \
    copy_head.enabled="$([ "$variant" = cplm ] && echo true || echo false)" \
    data.synthetic=copy data.document_masking=false train.tokens=null train.iters="$iters" train.seq_len="$seq" \
    train.micro_batch="$micro" train.global_batch="$micro" train.log_interval=1 train.eval_interval=0 \
    schedule.warmup_iters=2 checkpoint.enabled=false optimizer.distributed=false \
    optimizer.overlap_grad_reduce=false optimizer.overlap_param_gather=false logging.wandb=false \
    precision.dtype=bf16 parallel.timeout_minutes=2
  for record in summary.json summary_stopped_early.json; do
    [ -f "$run/$record" ] && cp "$run/$record" "$WORK/$name.json" && break
  done
  cp "$run/metrics.jsonl" "$WORK/$name.metrics.jsonl" 2>/dev/null
  cp "$run/config.yaml" "$WORK/$name.yaml" 2>/dev/null
  publish
}

log "$([ "$DRY_RUN" = 1 ] && echo "CPU DRY RUN (tiny sizes, not a measurement)" || echo "GPU checks"); budgets ${TOTAL}s; \
steps: $(cut -f1 "$WORK/plan.tsv" | paste -sd,); python $PY; work dir $WORK"
{ nvidia-smi || echo "no nvidia-smi"; } > "$WORK/logs/nvidia-smi.log" 2>&1

export -f install_wheels
export PY DRY_RUN WORK
step install bash -c install_wheels
step compat "$PY" benchmarks/gpu/gpu_steps.py compat "$WORK"
if [ "$DRY_RUN" = 1 ]; then
  step kernel_check "$PY" benchmarks/gpu_kernel_check.py --tiny --json "$WORK/kernel_check.json"
  step kernel_bench "$PY" benchmarks/copy_kernel.py --gpu-row-set --seq-lens 32 64 --head-dims 32 \
    --json "$WORK/copy_kernel.json"
  step attention "$PY" benchmarks/attention.py --quick --json "$WORK/attention.json"
  train small base tiny 64 2 3
  train small cplm tiny 64 2 3
  train large base tiny 128 2 3
  train large cplm tiny 128 2 3
else
  step kernel_check "$PY" benchmarks/gpu_kernel_check.py --json "$WORK/kernel_check.json"
  step kernel_bench "$PY" benchmarks/copy_kernel.py --seq-lens 4096 16384 32768 --head-dims 64 \
    --json "$WORK/copy_kernel.json"
  step attention "$PY" benchmarks/attention.py --json "$WORK/attention.json"
  train small base smollm2-135m 2048 8 30
  train small cplm smollm2-135m 2048 8 30
  # 1.7B at micro 2: ~38 GiB planned with SDPA (tools/model_info.py; 76 with the unfused attention) of 139 GiB
  train large base smollm2-1.7b 2048 2 25
  train large cplm smollm2-1.7b 2048 2 25
fi

# ---- the LM-head loss benchmark: Megatron's output layer + CE vs chunked vs fused ----------------------
LM_HEAD_ARGS=(--json "$WORK/lm_head_loss.json")
if [ "$DRY_RUN" = 1 ]; then LM_HEAD_ARGS+=(--quick); fi
step lm_head_loss "$PY" benchmarks/lm_head_loss.py "${LM_HEAD_ARGS[@]}"

step summary "$PY" benchmarks/gpu/gpu_steps.py summary "$WORK" "$OUT/summary.json" --budget-limit "$BUDGET_LIMIT" \
  "${SUMMARY_FLAGS[@]}"
RESULT=$(awk -F'\t' '$3 != 0 { bad = 1 } END { print bad + 0 }' "$WORK/steps.tsv")
FINISHED=1
log "done in ${SECONDS}s"
exit "$RESULT"
