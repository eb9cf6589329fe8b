#!/usr/bin/env bash
# One prepared pass over the GPU-only paths, sized for one lease of a lent machine (one H200, 15 minutes of
# device time per task, a machine start included; nothing can be downloaded there). Every step is
# time-boxed and the budgets below sum to <= 540 s, so the script ends within 9 minutes; later steps run
# even if an earlier one fails. Every figure the README's GPU table needs lands in one summary.json.
#
#   bash benchmarks/gpu/prepare_wheels.sh                 # here, first: the wheels the GPU image lacks -> .whl/
#   OUT=DIR bash benchmarks/gpu/run_gpu_checks.sh         # on the GPU machine (device tool: carry .whl)
#   bash benchmarks/gpu/run_gpu_checks.sh --cpu-dry-run   # every step at tiny sizes on CPU (a CI test runs it)
#
# Steps (budget in s):
#   install       30  the carried wheels (.whl/) into a private site dir; imports checked
#   compat        30  the compat layer on CUDA: no CPU patch; the torch-fallback fixes (no Apex/TE in the image)
#   kernel_check  75  fused copy kernels vs the PyTorch reference at T=4096 (bf16, fp32, FP8; d 64/128)
#   kernel_bench 110  copy kernels at T = 4k/16k/32k, d=64: fused vs SDPA flash vs chunked vs naive, FP8 vs
#                     bf16, extra memory
#   train_*      260  pretrain_cplm.py, bf16, local layer spec, synthetic data: SmolLM2-135M (seq 2048,
#                     micro 8, 30 steps) and SmolLM2-1.7B (seq 2048, micro 4, 25 steps), baseline and CPLM:
#                     tokens/s, MFU, step time, peak memory (the trainer averages the last 20 steps)
#   lm_head_loss  30  benchmarks/lm_head_loss.py (Megatron's LM-head loss path vs chunked vs fused)
#   summary        5  benchmarks/gpu/gpu_steps.py summary -> $OUT/summary.json
# Outputs (3 files, what the device tool brings back): $OUT/summary.json, $OUT/steps.log and
# $OUT/details.tar.gz (every step's log and raw JSON).
set -uo pipefail

DRY_RUN=0
case "${1:-}" in
  --cpu-dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: run_gpu_checks.sh [--cpu-dry-run]" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-checks.XXXXXX")
mkdir -p "$WORK/logs"
PY=${PYTHON:-python3}
if [ "$DRY_RUN" = 1 ]; then
  if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
  export CUDA_VISIBLE_DEVICES=""  # the CPU path even where a GPU is visible
fi
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled

declare -A BUDGET=([install]=30 [compat]=30 [kernel_check]=75 [kernel_bench]=110 [train_small_base]=50
                   [train_small_cplm]=50 [train_large_base]=80 [train_large_cplm]=80 [lm_head_loss]=30 [summary]=5)
TOTAL=0
for name in "${!BUDGET[@]}"; do TOTAL=$((TOTAL + BUDGET[$name])); done
if [ "$TOTAL" -gt 540 ]; then echo "step budgets sum to ${TOTAL}s > 540s" >&2; exit 2; fi
# The dry run keeps the budgets it reports but allows each step 10x: CI machines are slow and shared.
TIMEOUT_SCALE=$((DRY_RUN ? 10 : 1))

log() { echo "[gpu-check $(date +%H:%M:%S)] $*" | tee -a "$WORK/steps.log"; }
step() {  # step NAME CMD...: run CMD within NAME's budget, log to $WORK/logs/NAME.log, record it in steps.tsv
  local name=$1 t0=$SECONDS rc
  shift
  log "start $name (budget ${BUDGET[$name]}s)"
  timeout "$((BUDGET[$name] * TIMEOUT_SCALE))" "$@" > "$WORK/logs/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "${BUDGET[$name]}" "$rc" "$((SECONDS - t0))" >> "$WORK/steps.tsv"
  log "end $name rc=$rc in $((SECONDS - t0))s"
  tail -n 15 "$WORK/logs/$name.log"
}

# The project without installing it: the repository on the path and kernels/ under its import name.
mkdir -p "$WORK/pkgs" "$WORK/site"
ln -s "$PWD/kernels" "$WORK/pkgs/cplm_kernels"
export PYTHONPATH="$WORK/site:$PWD:$WORK/pkgs${PYTHONPATH:+:$PYTHONPATH}"

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
  local slot=$1 variant=$2 preset=$3 seq=$4 micro=$5 iters=$6 run="$WORK/runs/$1_$2"
  local dtype=bf16
  if [ "$DRY_RUN" = 1 ]; then dtype=fp32; fi
  step "train_${slot}_$variant" "$PY" pretrain/pretrain_cplm.py --config configs/smollm2_135m.yaml --set \
    run.dir="$run" model.preset="$preset" copy_head.enabled="$([ "$variant" = cplm ] && echo true || echo false)" \
    data.synthetic=copy data.document_masking=false train.tokens=null train.iters="$iters" train.seq_len="$seq" \
    train.micro_batch="$micro" train.global_batch="$micro" train.log_interval=5 train.eval_interval=0 \
    schedule.warmup_iters=2 checkpoint.enabled=false optimizer.distributed=false \
    optimizer.overlap_grad_reduce=false optimizer.overlap_param_gather=false logging.wandb=false \
    precision.dtype="$dtype"
  cp "$run/summary.json" "$WORK/train_${slot}_$variant.json" 2>/dev/null
  cp "$run/config.yaml" "$WORK/train_${slot}_$variant.yaml" 2>/dev/null
}

log "$([ "$DRY_RUN" = 1 ] && echo "CPU DRY RUN (tiny sizes, not a measurement)" || echo "GPU checks"); budgets ${TOTAL}s; work dir $WORK"
{ nvidia-smi || echo "no nvidia-smi"; } > "$WORK/logs/nvidia-smi.log" 2>&1

export -f install_wheels
export PY DRY_RUN WORK
step install bash -c install_wheels
step compat "$PY" benchmarks/gpu/gpu_steps.py compat "$WORK"
if [ "$DRY_RUN" = 1 ]; then
  step kernel_check "$PY" benchmarks/gpu_kernel_check.py --tiny --json "$WORK/kernel_check.json"
  step kernel_bench "$PY" benchmarks/copy_kernel.py --gpu-row-set --seq-lens 32 64 --head-dims 32 \
    --json "$WORK/copy_kernel.json"
  train small base tiny 64 2 3
  train small cplm tiny 64 2 3
  train large base tiny 128 2 3
  train large cplm tiny 128 2 3
else
  step kernel_check "$PY" benchmarks/gpu_kernel_check.py --json "$WORK/kernel_check.json"
  step kernel_bench "$PY" benchmarks/copy_kernel.py --seq-lens 4096 16384 32768 --head-dims 64 \
    --json "$WORK/copy_kernel.json"
  train small base smollm2-135m 2048 8 30
  train small cplm smollm2-135m 2048 8 30
  train large base smollm2-1.7b 2048 4 25
  train large cplm smollm2-1.7b 2048 4 25
fi

# ---- the LM-head loss benchmark: Megatron's output layer + CE vs chunked vs fused ----------------------
LM_HEAD_ARGS=(--json "$WORK/lm_head_loss.json")
if [ "$DRY_RUN" = 1 ]; then LM_HEAD_ARGS+=(--quick); fi
step lm_head_loss "$PY" benchmarks/lm_head_loss.py "${LM_HEAD_ARGS[@]}"

DRY_FLAG=()
if [ "$DRY_RUN" = 1 ]; then DRY_FLAG=(--dry-run); fi
step summary "$PY" benchmarks/gpu/gpu_steps.py summary "$WORK" "$OUT/summary.json" "${DRY_FLAG[@]}"
RC=$(awk -F'\t' '$3 != 0 { bad = 1 } END { print bad + 0 }' "$WORK/steps.tsv")
log "done in ${SECONDS}s; summary: $OUT/summary.json"
cp "$WORK/steps.log" "$OUT/steps.log"
tar -czf "$OUT/details.tar.gz" -C "$WORK" --exclude=runs --exclude=site --exclude=pkgs .
rm -rf "$WORK"
exit "$RC"
