#!/bin/bash
# SmolLM2-1.7B-style long-context (32k) training with the Copy-Paste head: 1 x 8-GPU node, recipe configs/smollm2_1p7b_32k.yaml.
#   sbatch slurm/pretrain_1p7b_32k.sh [--config FILE] [--set key=value ...]   (submit from the repository root)
# Arguments go to pretrain/pretrain_cplm.py after the recipe: --config replaces it, --set applies last.
# Requeues itself after the time-limit warning (USR1 600s ahead) and resumes; see slurm/README.md.
# sbatch options given on the command line (--nodes, --time, ...) override the directives below.
#SBATCH --job-name=cplm-1p7b-32k
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm/logs/%x-%j.out
set -euo pipefail
recipe=configs/smollm2_1p7b_32k.yaml
# SLURM runs a copy of this script, so find the checkout: CPLM_REPO, this file's, or the submit dir.
for repo in "${CPLM_REPO:-}" "$(dirname "$(readlink -f "$0")")/.." "${SLURM_SUBMIT_DIR:-}"; do
  if [ -n "$repo" ] && [ -x "$repo/slurm/launch.sh" ]; then exec "$repo/slurm/launch.sh" "$recipe" "$@"; fi
done
echo "error: slurm/launch.sh not found; submit from the repository root or set CPLM_REPO" >&2
exit 2
