"""benchmarks/long_context.py end to end at a very small size: both tiny models trained 2 steps at seq 64 in one
process, then from those weights with CP=2 (torchrun, 2 processes) at seq 256 for 3 steps, scored by length (128,
256 and 512: beyond the trained length), the JSON and the plot written; a second call reuses the runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.long_context"  # run as users do: python -m, from the checkout's root
LENGTHS, VOCAB = [128, 256, 512], 512

pytestmark = pytest.mark.mcore  # training and scoring through megatron-core


@pytest.mark.slow
def test_tiny_cp2_pipeline_writes_results_by_length(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", MODULE, "--runs", str(tmp_path / "runs"), "--out", str(out),
                           "--seq-len", "256", "--iters", "3", "--lengths", ",".join(map(str, LENGTHS)),
                           "--depths", "0,1", "--samples", "1", "--vocab", str(VOCAB), "--short-seq-len", "64",
                           "--short-iters", "2", "--short-global-batch", "2", "--phase-lengths", "32,64"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "long_context_cpu.json").read_text())
    assert (out / "long_context_cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["settings"]["cp"] == 2 and report["settings"]["seq_len"] == 256
    assert set(report["runs"]) == {"baseline", "cplm"}
    for name, run in report["runs"].items():
        short, long = run["phases"]
        assert (short["phase"], short["seq_len"], short["cp"], short["iterations"]) == ("short", 64, 1, 2)
        assert [row["length"] for row in short["by_length"]] == [32, 64] and "by_length" not in long
        assert (long["phase"], long["seq_len"], long["cp"], long["iterations"]) == ("long", 256, 2, 3)
        assert report["train_commands"][name] == f"{short['command']} && {long['command']}"
        for phase, nproc, items in ((short, 1, ("parallel.cp=1", "train.seq_len=64")),
                                    (long, 2, ("parallel.cp=2", "train.seq_len=256", "checkpoint.load_optimizer=false",
                                               f"checkpoint.load={short['run_dir']}"))):
            assert phase["command"].startswith(f"python -m torch.distributed.run --standalone --nproc_per_node={nproc} "
                                               "pretrain/pretrain_cplm.py --config configs/tiny.yaml")
            for item in (*items, "data.synthetic=copy_random+passkey", "model.max_position_embeddings=512",
                         f"copy_head.enabled={str(name == 'cplm').lower()}"):
                assert item in phase["command"].split(), (name, phase["phase"], item)
        log = (Path(run["run_dir"]) / "train.log").read_text()
        assert "[train] layout tp=1 pp=1 dp=1 cp=2 " in log and f"started from {short['run_dir']}" in log
        assert run["iterations"] == 3 and run["final_loss"] > 0 and run["copy_head"] == (name == "cplm")
        assert run["train_cpu_seconds"] > 0 and run["eval_cpu_seconds"] > 0
        assert Path(run["run_dir"]).parent == tmp_path / "runs" / "copy_random"
        assert run["chance"] == {"copy_accuracy": pytest.approx(1 / (VOCAB - 1)),
                                 "passkey_first_token_accuracy": pytest.approx(1 / (VOCAB - 3))}
        assert [row["length"] for row in run["by_length"]] == LENGTHS
        for row in run["by_length"]:
            for key in ("copy_accuracy", "copy_accuracy_one_token_match", "passkey_first_token_accuracy",
                        "passkey_accuracy"):
                assert 0 <= row[key] <= 1, (name, key)
            assert [cell["depth"] for cell in row["passkey_by_depth"]] == [0.0, 1.0]
            assert row["copy_sequences"] == row["passkey_samples_per_depth"] == 1 and row["cpu_seconds"] > 0
            assert ("copy_head_accuracy" in row and "copy_mean_gate" in row) == (name == "cplm")
    assert "length    512" in proc.stdout and "cplm short phase, length     64:" in proc.stdout
    assert report["settings"]["copy_task"] == "copy_random"
    assert report["command"].startswith("python -m benchmarks.long_context --runs "), report["command"]
    # a second call trains nothing and reports the training time the first one recorded
    again = subprocess.run([*proc.args, "--name", "again"], env=env, cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and "training" not in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
    second = json.loads((out / "again.json").read_text())
    for name, run in report["runs"].items():
        assert [p["train_seconds"] for p in second["runs"][name]["phases"]] == [p["train_seconds"] for p in run["phases"]]
    # another vocabulary (or lr, global batch, ...) with the same run dirs: refused, nothing trained or relabelled
    # (issue 43 item 3: the vocab-512 models were reported as vocab_size=256)
    other = subprocess.run([*proc.args, "--name", "other", "--vocab", "256"], env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=600)
    errors = [line for line in other.stderr.splitlines() if line.startswith("error: ")]
    assert other.returncode == 2 and len(errors) == 1 and "training" not in other.stdout, other.stderr[-3000:]
    assert "holds a run trained with other settings (model.vocab_size: 512 -> 256)" in errors[0], errors
    assert not (out / "other.json").exists()


@pytest.mark.slow
def test_killing_the_benchmark_in_its_long_phase_stops_torchrun_and_keeps_its_time(tmp_path):
    """kill -9 of the benchmark left its torchrun workers training, and its training time was recorded as null:
    torchrun gets SIGTERM when the benchmark dies (its workers checkpoint and stop), and the phase's time is written
    every few seconds while it trains."""
    import signal
    import time

    import psutil

    runs = tmp_path / "runs"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    bench = subprocess.Popen([sys.executable, "-m", MODULE, "--runs", str(runs), "--out", str(tmp_path / "out"),
                              "--seq-len", "256", "--cp", "1", "--iters", "200", "--short-iters", "0",
                              "--vocab", str(VOCAB),
                              "--lengths", "256", "--samples", "1"], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    run_dir = runs / "copy_random" / "baseline"
    try:
        deadline = time.monotonic() + 300
        # training, and its first time tick written (every TICK_S seconds: killed before it, there is no time yet)
        while time.monotonic() < deadline and not ((run_dir / "metrics.jsonl").is_file()
                                                   and (run_dir / "bench_timing.json").is_file()):
            assert bench.poll() is None, "the benchmark exited before training"
            time.sleep(0.2)
        training = psutil.Process(bench.pid).children(recursive=True)
        assert training, "no torchrun under the benchmark"
        os.kill(bench.pid, signal.SIGKILL)
        bench.wait()
        gone = psutil.wait_procs(training, timeout=120)[1]
        assert not gone, [p.cmdline() for p in gone]
    finally:
        try:
            os.killpg(bench.pid, signal.SIGKILL)  # whatever is left
        except ProcessLookupError:
            pass
    assert json.loads((run_dir / "bench_timing.json").read_text())["train_seconds"] > 0
    log = (run_dir / "train.log").read_text()
    assert "exit code 75 = resume me" in log, log[-3000:]  # the workers stopped with a checkpoint
