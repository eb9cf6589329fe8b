"""slurm/prepare_data.sh on two emulated nodes: an array of 3 parts plus the dependent merge gives the documents
of a single-machine run and trains the tiny recipe; a part killed mid-write is redone alone on resubmission;
bad input is one `error:` line and exit 2 per task. Its usage errors need no cluster."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from cplm_megatron.data.inputs import part_of
from cplm_megatron.data.manifest import read_manifest
from cplm_megatron.data.prepare import prepare_dataset
from tests.data.packed_docs import documents_of, loader_samples
from tests.slurm.conftest import CLUSTER_ROOT
from tests.slurm.jobs import JOB_TIMEOUT, PRETRAIN_1P7B, REPO, SLURM_DIR, Job, job_env, logged_iterations, tiny_cpu_overrides

SCRIPT = SLURM_DIR / "prepare_data.sh"
PARTS = 3
# Part 2 gets ~1.6 MB of sources (seconds of tokenizing: time to kill it mid-write), parts 1 and 3 ~150 KB each.
PART_BYTES = {1: 150_000, 2: 1_600_000, 3: 150_000}
TRAIN_ITERS = 4


def corpus_files(corpus, part_bytes: dict[int, int]) -> list[Path]:
    """Training files of the embedded corpus, up to part_bytes[i] of those that fall into part i of 3."""
    files, total = [], dict.fromkeys(part_bytes, 0)
    for name in corpus.train.source_files:
        path = Path(name)
        part = part_of(path, PARTS)
        if path.is_file() and total[part] + path.stat().st_size <= part_bytes[part]:
            files.append(path)
            total[part] += path.stat().st_size
    return files


class Submission:
    """`slurm/prepare_data.sh --parts 3 --wait ARGS` in the background."""

    def __init__(self, args: list[str], only: str | None = None):
        self.proc = subprocess.Popen(["bash", str(SCRIPT), "--parts", str(PARTS), "--wait",
                                      *(["--only", only] if only else []), *args], cwd=REPO,
                                     env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline()
        match = re.search(rf"parts: job (\d+) \(array {only or '1-3'} of 3\), logs in (\S+)", first)
        if not match:
            self.proc.wait(60)
            pytest.fail(f"prepare_data.sh did not submit: {first}{self.proc.stdout.read()}{self.proc.stderr.read()}")
        self.array_job, self.logs = match.group(1), Path(match.group(2))

    def wait(self, timeout: float = JOB_TIMEOUT) -> tuple[int, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            subprocess.run(["scancel", self.array_job], check=False)
            self.proc.kill()
            pytest.fail(f"the array {self.array_job} and its merge did not finish within {timeout} s")
        return self.proc.returncode, out + err

    def part_log(self, index: int) -> str:
        path = self.logs / f"part-{index}-of-{PARTS:05d}-{self.array_job}.out"
        return path.read_text() if path.exists() else f"(no log {path})"

    def merge_log(self) -> str:
        logs = sorted(self.logs.glob("merge-*.out"), key=lambda p: int(p.stem.split("-")[1]))
        return logs[-1].read_text() if logs else "(no merge log)"


def stop_part(out: Path, index: int) -> list[int]:
    """SIGSTOP part INDEX's prepare_data process and its children, so scancel's latency (seconds on a loaded
    machine) cannot let the part finish between the test seeing its first shard and the kill."""
    found = subprocess.run(["pgrep", "-f", "--", f"--part {index}/{PARTS} .*--output {out}( |$)"],
                           capture_output=True, text=True).stdout.split()
    stopped: list[int] = []
    while found:
        pid = int(found.pop())
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        stopped.append(pid)
        found += subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return stopped


def cluster_state() -> str:
    """squeue, sinfo and the job logs' names: what a test that waited in vain saw (jobs pending, nodes down)."""
    commands = (["squeue", "-a", "-o", "%i %j %T %R"], ["sinfo", "-N", "-o", "%N %T %E"])
    return "\n".join(subprocess.run(cmd, capture_output=True, text=True).stdout.strip() for cmd in commands)


def part_files_state(part: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in part.iterdir()}


@pytest.mark.slurm
@pytest.mark.slow
def test_array_of_parts_and_merge_redo_a_killed_part_and_train(local_slurm, stdlib_corpus, tmp_path,
                                                               isolated_streaming):
    local_slurm.ensure(nodes=2)
    files = corpus_files(stdlib_corpus, PART_BYTES)
    listing = tmp_path / "files.txt"
    listing.write_text("\n".join(map(str, files)) + "\n")
    out = tmp_path / "ds"
    seq_len = stdlib_corpus.train.seq_len
    args = ["--input", f"@{listing}", "--tokenizer", str(stdlib_corpus.tokenizer_dir), "--output", str(out),
            "--seq-len", str(seq_len), "--workers", "1", "--shard-size", "16kb", "--progress-every", "1"]

    # 1. part 2 is killed (scancel) while it writes shards: no merge, parts 1 and 3 complete
    first = Submission(args)
    deadline = time.monotonic() + JOB_TIMEOUT
    while not list(out.glob(".part-00002-of-00003.tmp-*/shard.*")) and time.monotonic() < deadline:
        assert first.proc.poll() is None, first.wait()[1]
        time.sleep(0.05)
    if not list(out.glob(".part-00002-of-00003.tmp-*/shard.*")):
        pytest.fail(f"part 2 wrote no shard within {JOB_TIMEOUT} s; the cluster then:\n{cluster_state()}")
    assert stop_part(out, 2), "part 2's prepare_data process was not found"
    assert not (out / "part-00002-of-00003" / "manifest.json").exists(), \
        "part 2 finished before it could be killed; raise PART_BYTES[2]"
    subprocess.run(["scancel", f"{first.array_job}_2"], check=True)
    rc, output = first.wait()
    assert rc != 0 and "not merged" in output, output
    assert not (out / "manifest.json").exists() and not (out / "part-00002-of-00003" / "manifest.json").exists()
    hosts = set()
    for i in (1, 3):
        log = first.part_log(i)
        assert f"[prepare_data] part {i}/3: " in log and '"status": "written"' in log, log
        hosts |= set(re.findall(r"on (c\d)\n", log))
    assert re.search(r"\[prepare_data\] part 2/3: \d+ input files ->", first.part_log(2)), first.part_log(2)
    hosts |= set(re.findall(r"on (c\d)\n", first.part_log(2)))
    assert hosts == {"c1", "c2"}, "the 3 parts should spread over both nodes (16 of 32 CPUs each)"
    kept = {i: part_files_state(out / f"part-0000{i}-of-00003") for i in (1, 3)}

    # 2. the same command again: parts 1 and 3 are verified and skipped, part 2 is redone, the merge runs
    second = Submission(args)
    rc, output = second.wait()
    assert rc == 0, output + second.part_log(2) + second.merge_log()
    for i in (1, 3):
        assert '"status": "up to date"' in second.part_log(i), second.part_log(i)
        assert part_files_state(out / f"part-0000{i}-of-00003") == kept[i]
    log2 = second.part_log(2)
    assert '"status": "written"' in log2 and re.search(r"part 2/3: done, [\d,]+ samples: ", log2), log2
    assert '"status": "merged"' in second.merge_log(), second.merge_log()

    # a rerun of one part alone (--only): verified and skipped, and the merge finds nothing to do
    third = Submission(args, only="3")
    rc, output = third.wait()
    assert rc == 0 and '"status": "up to date"' in third.part_log(3), output + third.part_log(3)
    assert "no log" in third.part_log(1) and '"status": "up to date"' in third.merge_log(), third.merge_log()

    # 3. exactly the documents of one single-machine run over the same inputs
    single = prepare_dataset(files, stdlib_corpus.tokenizer_dir, tmp_path / "single", seq_len=seq_len, workers=1,
                             show_progress=False)
    merged = read_manifest(str(out))
    assert (merged.documents, merged.tokens) == (single.manifest.documents, single.manifest.tokens)
    eod = stdlib_corpus.tokenizer.eod_id
    merged_docs = documents_of(loader_samples(out, seq_len), [p["samples"] for p in merged.settings["parts"]], eod)
    single_docs = documents_of(loader_samples(single.output, seq_len), [single.manifest.samples], eod)
    assert Counter(merged_docs) == Counter(single_docs)

    # 4. the tiny recipe trains on it (a SLURM job of the 1.7B script turned tiny, as the other SLURM tests do)
    run_dir = tmp_path / "run"
    job = Job(PRETRAIN_1P7B, ["--nodes=1", "--ntasks-per-node=1"],
              tiny_cpu_overrides(stdlib_corpus, run_dir, TRAIN_ITERS, f"data.streams={out}"), tmp_path / "train.out")
    assert job.wait() == 0, job.tail()
    assert logged_iterations(run_dir) == list(range(1, TRAIN_ITERS + 1))


@pytest.mark.slurm
@pytest.mark.slow
def test_bad_input_is_one_error_line_and_exit_2_per_task(local_slurm, stdlib_corpus, tmp_path):
    local_slurm.ensure(nodes=2)
    out = tmp_path / "ds"
    submission = Submission(["--input", str(corpus_files(stdlib_corpus, {1: 10_000, 2: 10_000, 3: 10_000})[0]), "--tokenizer",
                             str(tmp_path / "no-tokenizer"), "--output", str(out), "--seq-len", "64"])
    rc, output = submission.wait()
    assert rc != 0 and "not merged" in output, output
    for i in range(1, PARTS + 1):
        log = submission.part_log(i)
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "no-tokenizer" in errors[0] and "Traceback" not in log, log
    # the tasks' exit codes, from the cluster's job-completion records
    records = (CLUSTER_ROOT / "log" / "jobcomp.log").read_text().splitlines()
    codes = {int(m.group(1)): m.group(2) for r in records
             if (m := re.search(rf"ArrayJobId={submission.array_job} ArrayTaskId=(\d+) .*ExitCode=(\S+)", r))}
    assert codes == {1: "2:0", 2: "2:0", 3: "2:0"}, records[-6:]
    assert not out.joinpath("manifest.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--input", "x"], "error: --parts N is required"),
    (["--parts", "3", "--input", "x"], "error: --output DIR is required"),
    (["--parts", "3", "--only", "2,4", "--output", "/tmp/x"], "error: --only 2,4: part 4 is outside 1..3"),
    (["--parts", "3", "--merge", "--output", "/tmp/x"], "error: --merge is chosen per job by this script"),
    (["--parts", "0", "--output", "/tmp/x"], "error: --parts N is required (a positive integer"),
])
def test_script_usage_errors_are_one_line_and_exit_2(args, message):
    result = subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith(message), \
        result.stderr
    assert result.stdout == ""
