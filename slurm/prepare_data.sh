#!/bin/bash
# Tokenize a pretraining corpus as a SLURM array: one task per part, then the merge as a dependent job.
#
#   slurm/prepare_data.sh --parts N [--only LIST] [--wait] PREPARE_DATA_ARGS...   (run, not sbatch: it submits)
#
#   slurm/prepare_data.sh --parts 64 --input 'corpus/**/*.jsonl.zst' --tokenizer tok/ --output data/big --seq-len 2048
#
# Submits `sbatch --array=1-N` of this script (task I runs tools/prepare_data.py --part I/N ARGS: a
# deterministic 1/N of the input files) and the merge (tools/prepare_data.py --merge --output DIR --parts N)
# with --dependency=afterok on the array and --kill-on-invalid-dep=yes (a failed part cancels the merge).
# PREPARE_DATA_ARGS are tools/prepare_data.py's, without --part/--merge; --output is required; --workers
# defaults to the task's CPUs (--cpus-per-task below).
#   --only LIST   submit only these array indices (e.g. --only 2,5) plus the merge: rerun failed parts alone.
#                 Resubmitting the whole array works too: complete, intact parts say "up to date" in seconds.
#   --wait        wait for the merge; exit 0 when the dataset is merged, else the merge job's exit code.
# Logs: <output>/logs/part-<I>-of-<N>-<array job>.out (progress lines per part) and merge-<job>.out.
# A task given bad input (missing tokenizer, unreadable or binary input file, ...) logs one `error:` line and
# exits 2, like the tool; this script's own usage errors do the same before anything is submitted.
# Environment: CPLM_SBATCH_ARGS="..." extra sbatch options for every job (split on spaces: --partition,
# --account, --time, ...); CPLM_ENV_SETUP=FILE sourced in each job first; CPLM_PYTHON=EXE (default
# <repo>/.venv/bin/python when present, else python3); CPLM_REPO=DIR the checkout (default: this file's).
#SBATCH --job-name=prepare-data
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
set -euo pipefail

die() {  # die MESSAGE: the bad-input contract, one line and exit 2
  echo "error: $*" >&2
  exit 2
}

find_repo() {  # SLURM runs a copy of this script: CPLM_REPO, this file's checkout, or the submit dir
  local repo
  for repo in "${CPLM_REPO:-}" "$(dirname "$(readlink -f "$0")")/.." "${SLURM_SUBMIT_DIR:-}"; do
    if [ -n "$repo" ] && [ -f "$repo/tools/prepare_data.py" ]; then (cd "$repo" && pwd); return; fi
  done
  die "tools/prepare_data.py not found; submit from the repository root or set CPLM_REPO"
}

python_of() {
  if [ -n "${CPLM_PYTHON:-}" ]; then echo "$CPLM_PYTHON"
  elif [ -x "$1/.venv/bin/python" ]; then echo "$1/.venv/bin/python"
  else command -v python3 || die "no python3 on PATH; set CPLM_PYTHON or CPLM_ENV_SETUP"
  fi
}

run_job() {  # inside SLURM: run_job part|merge N ARGS...
  local job=$1 parts=$2 repo python
  shift 2
  if [ -n "${CPLM_ENV_SETUP:-}" ]; then
    # shellcheck source=/dev/null
    source "$CPLM_ENV_SETUP"
  fi
  repo=$(find_repo)
  python=$(python_of "$repo")
  cd "${SLURM_SUBMIT_DIR:-$repo}"  # relative inputs are relative to where the user submitted
  export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  if [ "$job" = merge ]; then
    echo "[prepare_data.sh] merge of $parts parts, job ${SLURM_JOB_ID:-?} on ${SLURMD_NODENAME:-$(hostname -s)}" >&2
    exec "$python" "$repo/tools/prepare_data.py" --merge --parts "$parts" "$@"
  fi
  local index=${SLURM_ARRAY_TASK_ID:?array task without SLURM_ARRAY_TASK_ID}
  echo "[prepare_data.sh] part $index/$parts, job ${SLURM_ARRAY_JOB_ID:-?}_$index on ${SLURMD_NODENAME:-$(hostname -s)}" >&2
  exec "$python" "$repo/tools/prepare_data.py" --part "$index/$parts" --workers "${SLURM_CPUS_PER_TASK:-1}" "$@"
}

if [ "${1:-}" = --job ]; then  # this script as an array task or the merge job (the submitter passes --job)
  [ $# -ge 3 ] || die "--job needs part|merge and N"
  shift
  run_job "$@"
fi

# ---- submitting (a login node) ----
parts="" only="" wait_merge=0 output=""
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --parts) [ $# -ge 2 ] || die "--parts needs a number"; parts=$2; shift 2 ;;
    --parts=*) parts=${1#*=}; shift ;;
    --only) [ $# -ge 2 ] || die "--only needs a list of part numbers"; only=$2; shift 2 ;;
    --only=*) only=${1#*=}; shift ;;
    --wait) wait_merge=1; shift ;;
    --part|--part=*|--merge) die "$1 is chosen per job by this script; pass --parts N (and --only LIST to rerun parts)" ;;
    --output) [ $# -ge 2 ] || die "--output needs a directory"; output=$2; shift 2 ;;
    --output=*) output=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ $parts =~ ^[1-9][0-9]*$ ]] || die "--parts N is required (a positive integer: the number of array tasks), got '${parts}'"
[ -n "$output" ] || die "--output DIR is required (the parts go to DIR/part-I-of-N, the merged dataset to DIR)"
if [ -n "$only" ]; then
  [[ $only =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] || die "--only '$only' is not a list of part numbers like 2,5-7"
  for n in ${only//[,-]/ }; do
    if [ "$n" -lt 1 ] || [ "$n" -gt "$parts" ]; then die "--only $only: part $n is outside 1..$parts"; fi
  done
fi
command -v sbatch >/dev/null || die "sbatch not found: run this on a SLURM login node"
script=$(readlink -f "$0")
mkdir -p "$output/logs" 2>/dev/null || die "cannot create $output/logs (is --output writable?)"
logs=$(cd "$output/logs" && pwd)
output=$(dirname "$logs")  # absolute: the jobs may start elsewhere
read -r -a extra <<< "${CPLM_SBATCH_ARGS:-}"
padded=$(printf '%05d' "$parts")
array_job=$(sbatch --parsable "${extra[@]}" --array="${only:-1-$parts}" \
  --output="$logs/part-%a-of-$padded-%A.out" "$script" --job part "$parts" "${args[@]}" --output "$output")
array_job=${array_job%%;*}
echo "[prepare_data.sh] parts: job $array_job (array ${only:-1-$parts} of $parts), logs in $logs"
merge_opts=(--parsable "${extra[@]}" --job-name=prepare-data-merge --cpus-per-task=1
            --dependency="afterok:$array_job" --kill-on-invalid-dep=yes --output="$logs/merge-%j.out")
if [ "$wait_merge" = 1 ]; then
  echo "[prepare_data.sh] merge: after job $array_job succeeds; waiting"
  rc=0
  submitted=$(mktemp)
  sbatch --wait "${merge_opts[@]}" "$script" --job merge "$parts" --output "$output" > "$submitted" || rc=$?
  merge_job=$(head -n1 "$submitted")
  merge_job=${merge_job%%;*}
  rm -f "$submitted"
  # a merge cancelled by its dependency (a part failed) never ran: sbatch --wait still says 0, but no log exists
  if [ "$rc" = 0 ] && [ ! -s "$logs/merge-$merge_job.out" ]; then rc=1; fi
  if [ "$rc" != 0 ]; then
    echo "[prepare_data.sh] not merged (merge job $merge_job: exit $rc): a part failed or was cancelled; see" \
         "$logs, then rerun this command (intact parts are skipped) or pass --only with the failed parts" >&2
  else
    echo "[prepare_data.sh] merged: $output (merge job $merge_job)"
  fi
  exit "$rc"
fi
merge_job=$(sbatch "${merge_opts[@]}" "$script" --job merge "$parts" --output "$output")
echo "[prepare_data.sh] merge: job ${merge_job%%;*} (runs when every part succeeded)"
