#!/usr/bin/env bash
# Downloads, on this machine, the Python 3.12 manylinux wheels of what the lent GPU image lacks into .whl/
# (git-ignored; run_gpu_checks.sh installs them there with pip --no-index) and prints their total size.
# The working tree plus these wheels travel at most 64 MiB per call; this script fails above 32 MiB.
#
# The image (Python 3.12, torch 2.11 cu130, triton 3.6, transformers 5.x, numpy, pyyaml, safetensors,
# tokenizers, psutil, einops, xxhash, pillow, ...) lacks megatron-core and mosaicml-streaming. Only what the
# checks import is carried: megatron-core (the training steps use synthetic data, so streaming is not needed;
# the CPU dry run blocks `import streaming` to prove it). Not carried: mosaicml-streaming and its needs (5.4
# MiB, never imported by the checks), Transformer Engine (its CUDA core wheel is too large to carry, and its
# torch extension ships as source only, too slow to build in a lease), DeepSpeed, wandb and lm-eval.
#
#   bash benchmarks/gpu/prepare_wheels.sh        # WHEEL_DIR=DIR to download elsewhere
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 2
DEST=${WHEEL_DIR:-.whl}
LIMIT_BYTES=$((32 * 1024 * 1024))
MCORE=$(sed -n 's/^megatron-core==\([0-9.]*\); python_version >= "3.12"$/\1/p' requirements/constraints-megatron-core.txt)
[ -n "$MCORE" ] || { echo "no Python >= 3.12 megatron-core pin in requirements/constraints-megatron-core.txt" >&2; exit 2; }
WHEELS=(
  "megatron-core==$MCORE"        # the newest release we test (its only hard needs, torch/numpy/packaging, are there)
)
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done

mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # one version of each: two would stop the install there
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"

total=0
for wheel in "$DEST"/*.whl; do
  size=$(stat -c %s "$wheel")
  total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$wheel")"
done
echo "total: $total bytes ($(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }') MiB) in $DEST"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "error: the wheels exceed $((LIMIT_BYTES / 1048576)) MiB; the tree plus wheels must stay under 64 MiB" >&2
  exit 1
fi
