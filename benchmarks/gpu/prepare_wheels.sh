#!/usr/bin/env bash
# Builds, on this machine, the wheels the lent GPU image lacks into .whl/ (git-ignored; run_gpu_checks.sh's
# install step puts them into a private site dir there with pip --no-index) and prints their total size:
#   * megatron-core: its Python 3.12 manylinux wheel (downloaded once; kept while the pin is unchanged);
#   * the project itself: `pip wheel . --no-deps`, rebuilt every time from the files the device tool carries
#     (tracked and untracked-not-ignored), in a copy: no stale build/ and no package data that only an editable
#     install would provide. The checks import the project from this wheel, never from the checkout.
# The working tree plus these wheels travel at most 64 MiB per call; this script fails above 32 MiB.
#
# The image (Python 3.12, torch 2.11 cu130, triton 3.6, transformers 5.x, numpy, pyyaml, safetensors,
# tokenizers, psutil, einops, ...) lacks megatron-core and mosaicml-streaming. Only what the checks import is
# carried: the training steps use synthetic data; the study step writes and reads MDS shards, so
# mosaicml-streaming and its compiled needs are carried for it (one pinned wheel each, --no-deps: no cloud SDKs).
# Not carried: Transformer Engine (its CUDA core wheel is too large to carry, its torch extension ships as source
# only), DeepSpeed, wandb, lm-eval.
#
#   bash benchmarks/gpu/prepare_wheels.sh        # -> .whl/ (cp312 megatron-core + the project)
#   WHEEL_DIR=DIR WHEEL_PYTHON_VERSION=3.11 bash benchmarks/gpu/prepare_wheels.sh   # the CPU dry run's wheels
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 2
DEST=${WHEEL_DIR:-.whl}
PYVER=${WHEEL_PYTHON_VERSION:-3.12}
BUILD_PY=${BUILD_PYTHON:-python3}
if [ -z "${BUILD_PYTHON:-}" ] && [ -x .venv/bin/python ]; then BUILD_PY=.venv/bin/python; fi
LIMIT_BYTES=$((32 * 1024 * 1024))
MCORE=$(sed -n 's/^megatron-core==\([0-9.]*\); python_version >= "3.12"$/\1/p' requirements/constraints-megatron-core.txt)
[ -n "$MCORE" ] || { echo "no Python >= 3.12 megatron-core pin in requirements/constraints-megatron-core.txt" >&2; exit 2; }
CP=cp${PYVER/./}
mkdir -p "$DEST"

# megatron-core: one version, one Python tag (two wheels would stop the install there)
have=("$DEST"/megatron_core-"$MCORE"-"$CP"-*.whl)
if [ ! -e "${have[0]}" ]; then
  rm -f "$DEST"/megatron_core-*.whl
  PLATFORMS=()
  for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
  done
  # --ignore-requires-python: 0.19.2 asks for 3.12; its cp311 wheel is what the CPU dry run installs
  "$BUILD_PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --ignore-requires-python \
    --python-version "$PYVER" --implementation cp "${PLATFORMS[@]}" -d "$DEST" "megatron-core==$MCORE"
fi

# mosaicml-streaming and what it imports beyond the image (the study step's MDS shards): the versions .venv tests,
# one wheel each for this Python tag, downloaded once (a pin's other versions and tags are replaced); zstd at 1.5.6.1,
# its newest release with a cp312 manylinux wheel
STREAMING_PINS=(mosaicml-streaming==0.13.0 zstd==1.5.6.1 xxhash==3.8.2 brotli==1.2.1 python-snappy==0.7.3
                cramjam==2.14.0 catalogue==2.0.10 pillow==13.0.0)
STREAMING_PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  STREAMING_PLATFORMS+=(--platform "${tag}_x86_64")
done
for pin in "${STREAMING_PINS[@]}"; do
  file=${pin%%==*}
  file=${file//-/_}
  have=("$DEST/$file-${pin#*==}"-py3-none-any.whl "$DEST/$file-${pin#*==}-$CP"-*.whl)
  if [ ! -e "${have[0]}" ] && [ ! -e "${have[1]}" ]; then
    rm -f "$DEST/$file"-[0-9]*.whl
    "$BUILD_PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version "$PYVER" --implementation cp "${STREAMING_PLATFORMS[@]}" -d "$DEST" "$pin"
  fi
done

# the project: from a copy of exactly what the device tool carries, built beside DEST and moved in (a dry run
# installing from DEST meanwhile sees the old wheel or the new one, never none)
SRC=$(mktemp -d "${TMPDIR:-/tmp}/cplm-wheel.XXXXXX")
BUILT=$(mktemp -d "$DEST/.build.XXXXXX")
trap 'rm -rf "$SRC" "$BUILT"' EXIT
git ls-files -z --cached --others --exclude-standard -- setup.py setup.cfg pyproject.toml MANIFEST.in cplm_megatron \
  cplm_kernels configs | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$SRC"
ISOLATION=()  # setuptools here: build without an isolated env (no download); else pip fetches it
if "$BUILD_PY" -c "import setuptools, wheel" 2>/dev/null; then ISOLATION=(--no-build-isolation); fi
"$BUILD_PY" -m pip wheel -q --disable-pip-version-check --no-deps "${ISOLATION[@]}" -w "$BUILT" "$SRC" \
  > "$BUILT/pip.log" 2>&1 || { cat "$BUILT/pip.log" >&2; echo "error: pip wheel of the project failed" >&2; exit 1; }
built=("$BUILT"/cplm_megatron-*.whl)
mv -f "${built[0]}" "$DEST/"
for wheel in "$DEST"/cplm_megatron-*.whl; do  # one version: two would stop the install
  [ "${wheel##*/}" = "${built[0]##*/}" ] || rm -f "$wheel"
done

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
