#!/usr/bin/env bash
# One prepared pass over the GPU-only paths, for a lent single-GPU machine (H200 here):
#   1. environment + install (megatron-core wheel carried in .whl/, the project itself --no-deps)
#   2. the CPU-compat layer's scope on a CUDA machine (only the no-Apex/TE patches may apply)
#   3. fused copy kernels vs the PyTorch reference at real sizes (bf16, fp32, FP8)
#   4. kernel benchmark (naive / chunked / fused / SDPA-flash; T up to 32k)
#   5. training throughput + MFU with pretrain_cplm.py (bf16, local layer spec), baseline vs CPLM
#   6. copy-head overhead at full model sizes
# Every step writes into $OUT (default benchmarks/results/gpu) and is time-boxed; later steps run even
# if an earlier one fails. Usage on the GPU machine, from the repository root:
#   OUT=/some/dir bash benchmarks/gpu/run_gpu_checks.sh
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
log() { echo "[gpu-check $(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  log "start $name (limit ${secs}s)"
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "end $name rc=$rc in $((SECONDS - t0))s"
  tail -n 25 "$OUT/$name.log"
}

log "environment"
{ nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" | tail -n 3

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# the project without installing: the repo on the path, and the kernels/ package under its import name
mkdir -p /tmp/cplm_pkgs && ln -sfn "$PWD/kernels" /tmp/cplm_pkgs/cplm_kernels
export PYTHONPATH="$PWD:/tmp/cplm_pkgs${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import megatron.core, cplm_kernels, cplm_megatron; print('megatron-core', megatron.core.__version__)" | tee -a "$OUT/env.txt"

step compat_scope 120 python3 -c "
import torch
from cplm_megatron.parallel.cpu_compat import PATCHES, apply_compat
applied = apply_compat()
cpu = {p.name for p in PATCHES if p.scope == 'cpu'}
print('applied:', applied)
assert not set(applied) & cpu, 'CPU patches leaked into a GPU run'
print('OK: no CPU-only patch on CUDA')"

step kernel_check 120 python3 benchmarks/gpu_kernel_check.py
step kernel_bench 240 python3 benchmarks/copy_kernel.py --json "$OUT/copy_kernel_h200.json"

train() {  # train NAME PRESET SEQ MICRO COPY
  local name=$1 preset=$2 seq=$3 micro=$4 copy=$5
  step "train_$name" 300 python3 pretrain/pretrain_cplm.py --config configs/smollm2_135m.yaml --set \
    run.dir="/tmp/gpu_runs/$name" model.preset="$preset" copy_head.enabled="$copy" data.synthetic=copy \
    train.tokens=null train.iters=30 train.seq_len="$seq" train.micro_batch="$micro" train.global_batch="$micro" \
    train.log_interval=5 train.eval_interval=0 schedule.warmup_iters=5 checkpoint.enabled=false \
    optimizer.distributed=false optimizer.overlap_grad_reduce=false optimizer.overlap_param_gather=false \
    data.document_masking=false logging.wandb=false
  cp "/tmp/gpu_runs/$name/summary.json" "$OUT/train_$name.summary.json" 2>/dev/null
}
train 135m_cplm smollm2-135m 2048 8 true
train 135m_base smollm2-135m 2048 8 false
train 1p7b_cplm smollm2-1.7b 2048 4 true
train 1p7b_base smollm2-1.7b 2048 4 false

step head_overhead 300 python3 benchmarks/copy_head_overhead.py --dtype bf16 --models smollm2-135m \
  --seqs 2048 4096 --reps 5 --json "$OUT/copy_head_overhead_h200.json"
log "done"
