"""tools/ablate.py: the plan pairs identical runs, and the SpamLang claim measured end to end."""
from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from cplm_megatron.experiments.ablation.plan import AblationSettings as Settings
from cplm_megatron.experiments.ablation.plan import ablation_runs as plan
from cplm_megatron.experiments.launch.launcher import Launcher
from tests.data_fixtures import load_tool

PNG = b"\x89PNG\r\n\x1a\n"


def test_pairs_differ_only_in_the_copy_head(tmp_path: Path):
    specs = plan(Settings(experiments=("spamlang",)), None)
    groups = {}
    for spec in specs:
        groups.setdefault(spec.group, []).append(spec)
    assert len(groups) == 6  # 3 vocabularies x tied/untied
    for baseline, cplm in groups.values():
        assert (baseline.copy_head, cplm.copy_head) == (False, True)
        assert baseline.settings[1:] == cplm.settings[1:] and baseline.evaluation == cplm.evaluation
        assert "data.synthetic=spamlang" in cplm.overrides() and "model.hidden_size=64" in cplm.overrides()
        assert dict(cplm.settings)["model.vocab_size"] >= 64 * 64
    for seed in (1234, 7):  # both halves of a pair get the seed
        pair = plan(Settings(experiments=("spamlang",), seed=seed), None)[:2]
        assert all({f"run.seed={seed}", f"data.seed={seed}"} <= set(spec.overrides()) for spec in pair)
    extra = plan(Settings(experiments=("spamlang",), extra_settings=(("copy_head.lm_loss_weight", 1),)), None)
    assert all(spec.overrides()[-1] == "copy_head.lm_loss_weight=1" for spec in extra)  # last: it wins
    ablate = load_tool("ablate")
    with pytest.raises(ValueError, match="other than copy_head.enabled"):
        ablate.settings_from_args(ablate.parse_args(["--output", "x", "--set", "copy_head.enabled=false"]))
    with pytest.raises(ValueError, match="--data DIR"):
        plan(Settings(experiments=("corpus",)), None)
    with pytest.raises(FileNotFoundError, match="make data"):
        plan(Settings(experiments=("corpus",)), tmp_path)


def _one_run():
    return plan(Settings(experiments=("spamlang",), spamlang_vocabs=(4096,), spamlang_ties=(False,)), None)[0]


def test_finished_runs_are_reused_and_other_settings_refused(tmp_path: Path):
    from cplm_megatron.experiments.records import JOB_RECORD_VERSION, write_job_record

    spec = _one_run()
    launcher = Launcher(tmp_path)
    run_dir = tmp_path / "runs" / spec.name
    run_dir.mkdir(parents=True)
    for name in ("eval.json", "summary.json"):
        (run_dir / name).write_text("{}")
    same = launcher.record(spec)
    write_job_record(run_dir / "job.json", same)
    assert str(tmp_path) not in (run_dir / "job.json").read_text()
    assert json.loads((run_dir / "job.json").read_text())["version"] == JOB_RECORD_VERSION
    reused = launcher.run_job(spec)  # nothing launched: it would fail on the fake files
    assert reused.error is None and reused.reused and reused.train_seconds == 0
    assert reused.status_line() == f"{spec.name}: reused (finished earlier with the same commands)"
    moved = tmp_path / "elsewhere"  # a study directory copied to another place (or machine) keeps its runs
    shutil.copytree(tmp_path / "runs", moved / "runs")
    assert Launcher(moved).run_job(spec).reused
    write_job_record(run_dir / "job.json", dataclasses.replace(same, settings={**same.settings, "train.iters": "1"}))
    refused = launcher.run_job(spec)
    assert "made with other settings" in refused.error
    (run_dir / "job.json").write_text('{"train": [')  # a job record cut short
    corrupt = launcher.run_job(spec)
    assert corrupt.error.startswith(f"{run_dir / 'job.json'} is not a readable job record")
    assert f"remove {run_dir} to retrain that run" in corrupt.error
    (run_dir / "job.json").write_text("[]")
    assert "is not a job record" in launcher.run_job(spec).error
    (run_dir / "job.json").write_text(json.dumps({**same.to_json(), "version": 99}))
    newer = launcher.run_job(spec).error
    assert "job record of version 99; this cplm_megatron reads versions 1 and 2" in newer


def test_timing_counts_every_attempt_of_a_job(tmp_path: Path):
    """A job killed mid-training and run again records both attempts' seconds (the clock ticks while it runs)."""
    from cplm_megatron.experiments.launch.launcher import _JobClock
    from cplm_megatron.experiments.records import run_seconds

    (tmp_path / "timing.json").write_text(json.dumps({"train_seconds": 100.0, "eval_seconds": 0.0, "attempts": 1,
                                                      "complete": False}))  # the killed attempt's last tick
    clock = _JobClock(tmp_path, "train_seconds", interval=0.05)
    deadline = time.monotonic() + 30  # a tick every 0.05 s; under load the first may come late (0.2 s flaked)
    ticked = json.loads((tmp_path / "timing.json").read_text())
    while (ticked["attempts"] < 2 or ticked["train_seconds"] <= 100.0) and time.monotonic() < deadline:
        time.sleep(0.05)
        ticked = json.loads((tmp_path / "timing.json").read_text())
    assert ticked["train_seconds"] > 100.0 and ticked["complete"] is False and ticked["attempts"] == 2
    seconds = clock.stop()
    clock = _JobClock(tmp_path, "eval_seconds")
    clock.stop(complete=True)
    final = json.loads((tmp_path / "timing.json").read_text())
    assert final["train_seconds"] == pytest.approx(100.0 + seconds) and final["complete"] is True
    assert run_seconds(tmp_path) == pytest.approx(final["train_seconds"] + final["eval_seconds"])
    # a garbled timing.json: one line naming it, for the report and for the job (a bare JSONDecodeError before)
    from cplm_megatron.experiments.records import RecordError

    (tmp_path / "timing.json").write_text('{"train_seconds": 12')
    with pytest.raises(RecordError, match=rf"^{tmp_path / 'timing.json'} is not a readable timing record .*remove it"):
        run_seconds(tmp_path)
    spec = _one_run()
    run_dir = tmp_path / "study" / "runs" / spec.name
    run_dir.mkdir(parents=True)
    launcher = Launcher(tmp_path / "study")
    from cplm_megatron.experiments.records import write_job_record

    write_job_record(run_dir / "job.json", launcher.record(spec))
    (run_dir / "timing.json").write_text("garbage")
    failed = launcher.run_job(spec)
    assert failed.error.startswith(f"{run_dir / 'timing.json'} is not a readable timing record"), failed.error


@pytest.mark.parametrize("backend", ["warm", "subprocess"])
def test_a_failed_job_reports_its_logs_last_lines(tmp_path: Path, backend: str):
    """The study's progress output is often all a CI log keeps: a failure shows its cause, not only a path;
    its exit code is the trainer's own (2: bad input), in a warm process as in a fresh interpreter."""
    broken = _one_run().with_settings(("model.nonsense", 1))
    failed = Launcher(tmp_path, backend=backend).run_job(broken)
    assert failed.error.startswith("training failed (exit 2); see ")
    assert "| error: unknown config key 'model.nonsense'" in failed.status_line()
    command = (tmp_path / "runs" / broken.name / "train.log").read_text().splitlines()[0].split()
    assert command[:2] == ["$", sys.executable] and "--config" in command  # the module, nothing of a checkout
    assert command[command.index("-m"):][:4] == ["-m", "cplm_megatron.pretrain", "--config", "tiny"]


@pytest.mark.slow
def test_spamlang_claim_cplm_reaches_99_percent(tmp_path: Path):
    """SpamLang, vocabulary 4096 = 64 x hidden 64, untied LM head: the CPLM reaches >= 99% accuracy within a few
    dozen steps. The baseline's accuracy at the same step and its steps to 99% are measured and reported
    (whatever they are; the test asserts they are there, not their value)."""
    out = tmp_path / "ablation"
    code = load_tool("ablate").main(["--output", str(out), "--quick", "--experiments", "spamlang",
                                     "--vocab-sizes", "4096", "--spamlang-ties", "untied", "--spamlang-iters", "20",
                                     "--spamlang-interval", "5", "--eval-sequences", "8"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    (claim,) = results["spamlang"]
    assert claim["vocab"] == 4096 and claim["hidden"] == 64 and claim["tied"] is False
    assert claim["checkpoint_steps"] == [0, 5, 10, 15, 20]
    assert claim["cplm_steps_to_99"] is not None and claim["cplm_steps_to_99"] <= 20
    assert claim["cplm_accuracy"]["20"] >= 0.99
    assert set(claim["baseline_accuracy"]) == {"0", "5", "10", "15", "20"}
    assert claim["baseline_accuracy_at_cplm_step"] is not None
    assert "baseline_steps_to_99" in claim  # a step, or null = not within 20 steps
    report = (out / "report.md").read_text()
    row = f"| 4096 | 64 | {claim.get('seed', '–')} | untied |"  # vocab, V/d, seed, LM head
    assert "## SpamLang at a vocabulary >= 64x the hidden size" in report and row in report, report
    assert claim["cplm_stays_99_from"] is not None
    for name in ("loss_curves.png", "copy_accuracy.png", "gradient_retention.png"):
        assert (out / name).read_bytes()[:8] == PNG


def test_study_settings_refuse_what_cannot_give_a_spread():
    ablate = load_tool("ablate")

    def settings(*args: str):
        return ablate.study_settings_from_args(ablate.parse_args(["--output", "x", "--study", *args]))

    assert settings().arms == ("baseline", "mixture", "aux1", "sentinel+aux1")
    assert settings("--arms", "baseline,decoupled").arms == ("baseline", "decoupled")  # retired arms stay runnable
    default = settings()
    assert default.seeds == (1, 2, 3, 4, 5) and default.scales == ("tiny", "small")
    assert default.arms_at("small") == ("baseline", "aux1", "sentinel+aux1") and default.seeds_at("small") == (1, 2, 3)
    assert len(default.grid()) == 4 * 5 + 3 * 3 == len(default.planned())
    assert settings("--seeds", "1,2").seeds_at("small") == (1, 2)  # --seeds: the same seeds at every scale
    assert settings("--arms", "baseline,mixture").arms_at("small") == ("baseline", "mixture")  # every scale
    with pytest.raises(ValueError, match=">= 2 distinct seeds"):
        settings("--seeds", "1")
    with pytest.raises(ValueError, match="must hold baseline"):
        settings("--arms", "mixture,aux1")
    with pytest.raises(ValueError, match="unknown arm"):
        settings("--arms", "baseline,aux7")


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_jobs_below_one_is_one_line_and_exit_2(jobs: str, tmp_path: Path, capsys):
    """--jobs 0 ran the default (2 at a time) and -1 one at a time, both silently; refused before anything runs."""
    ablate = load_tool("ablate")
    assert ablate.main(["--output", str(tmp_path / "out"), "--study", "--jobs", jobs]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: --jobs must be >= 1 (runs at a time), got {jobs}; leave it out for the default"], err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_study_smoke_runs_arms_seeds_spamlang_and_reports(tmp_path: Path, stdlib_corpus):
    """The recipe study's whole pipeline at smoke size: runs, aggregation, decision, SpamLang, report, plots;
    a second invocation reuses every finished run."""
    reuse = stdlib_corpus.root.name == "stdlib" and stdlib_corpus.tokenizer.vocab_size == 4096
    data_root = stdlib_corpus.root.parent if reuse else tmp_path / "data"  # else the study builds its corpus
    out = tmp_path / "study"
    args = ["--study", "--smoke", "--output", str(out), "--data-root", str(data_root)]
    assert load_tool("ablate").main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    tiny = summary["scales"]["tiny"]
    assert list(tiny["arms"]) == ["baseline", "mixture", "sentinel"] and tiny["seeds"] == [1, 2]
    for arm in ("mixture", "sentinel"):
        per_seed = tiny["arms"][arm]["per_seed"]
        assert set(per_seed) == {"1", "2"}
        assert all(s["val_loss"] > 0 and s["lm_val_loss"] > 0 and 0 <= s["copy_accuracy"] <= 1 for s in per_seed.values())
        assert tiny["arms"][arm]["mean_std"]["val_loss"]["n"] == 2
        assert tiny["arms"][arm]["paired_vs_baseline"]["val_loss"]["seeds"] == 2
    decision = summary["decision"]
    assert decision["default"] in ("baseline", "mixture", "sentinel")
    assert set(decision["credited"]) | set(decision["not_credited"]) == {"mixture", "sentinel"}
    assert decision["provisional"] is True and decision["scales_not_started"] == ["small"]  # never the planned grid
    assert set(tiny["between_arms"]) == {"sentinel - mixture"} and set(tiny["vs_baseline"]) == {"mixture", "sentinel"}
    cache = tiny["cache_control"]  # the evaluation-only arm, from the baselines' checkpoints
    assert set(cache["per_seed"]) == {"1", "2"} and cache["mean_std"]["val_loss"]["n"] == 2
    assert set(tiny["vs_cache"]) == {"mixture", "sentinel"}
    sentinel = tiny["arms"]["sentinel"]["per_seed"]["1"]
    assert sentinel["val_loss_source"] == "val task (every sample)" and sentinel["val_loss_ci"][0] <= sentinel["val_loss"]
    assert 0.9 < sentinel["logit_grad_outside_span_chance"] < 1 and sentinel["train_flops_per_token"] > 0
    assert sentinel["passkey_first_token_chance"] == 1 / (4096 - 3) and sentinel["copy_accuracy_chance"] == 1 / 4095
    assert 0 <= sentinel["passkey_first_token_accuracy"] <= 1
    assert sentinel["train_curve"][-1]["objective"] >= sentinel["train_curve"][-1]["nll"] > 0  # sentinel: no aux term
    [claim] = summary["spamlang"]
    assert claim["vocab"] == 4096 and claim["hidden"] == 64
    report = (out / "report.md").read_text()
    assert "## Decision" in report and summary["rule"] in report and "## SpamLang at vocabulary" in report
    assert "**Provisional**" in report and "baseline+cache (evaluation only)" in report
    assert "- **decoupled**: dominated by aux1" in report and "Paired comparisons:" in report
    for name in ("val_loss_curves.png", "train_nll_curves.png", "final_metrics.png", "passkey_by_length.png"):
        assert (out / name).read_bytes()[:8] == PNG
    before = {p: p.stat().st_mtime for p in (out / "runs").glob("*/eval.json")}
    assert load_tool("ablate").main(args) == 0
    assert {p: p.stat().st_mtime for p in (out / "runs").glob("*/eval.json")} == before  # nothing re-run
    shutil.rmtree(out / "runs" / "tiny-mixture-s2")  # a partial grid: summarized without training anything
    assert load_tool("ablate").main([*args, "--summarize-only"]) == 0
    partial = json.loads((out / "summary.json").read_text())
    assert "tiny-mixture-s2" in partial["decision"]["missing_runs"] and not (out / "runs" / "tiny-mixture-s2").exists()
    assert partial["scales"]["tiny"]["arms"]["mixture"]["mean_std"]["val_loss"]["n"] == 1


def test_a_job_after_a_code_change_starts_in_a_fresh_interpreter(tmp_path: Path, monkeypatch):
    """Warm jobs fork from a server that imported the project once; after an edit they would mix old modules
    with new files, so the runner falls back to a fresh interpreter and says so in the job's log."""
    import os
    import time

    from cplm_megatron.experiments.launch import warm

    source = tmp_path / "edited.py"
    source.write_text("")
    os.utime(source, (0, 0))  # as old as the checkout's files
    monkeypatch.setattr(warm, "_source_files", lambda: [source])
    warm.warm_context()
    assert not warm.source_changed()
    later = time.time() + 5
    os.utime(source, (later, later))  # edited after the server preloaded the code
    assert warm.source_changed()
    broken = _one_run().with_settings(("model.nonsense", 1))
    failed = Launcher(tmp_path).run_job(broken)
    log = (tmp_path / "runs" / broken.name / "train.log").read_text()
    assert "code changed since this tool started: a fresh interpreter" in log and "exit 2" in failed.error


def _small_runs(names) -> list:
    """Runs of a few seconds: 40 steps of the tiny recipe on synthetic copy data, scored on 2 copy sequences."""
    from cplm_megatron.experiments.run import Evaluation, Run

    settings = (("copy_head.enabled", True), ("data.synthetic", "copy"), ("model.vocab_size", 256),
                ("train.seq_len", 64), ("train.micro_batch", 2), ("train.global_batch", 2), ("train.iters", 40),
                ("train.log_interval", 1), ("train.eval_interval", 0), ("checkpoint.interval", 0),
                ("logging.wandb", False))
    return [Run(name, "ctrl-c", settings, Evaluation(("copy",), limit=2)) for name in names]


@pytest.mark.slow
def test_ctrl_c_cancels_the_queue_stops_the_running_job_with_a_checkpoint_and_a_relaunch_continues(tmp_path: Path):
    """Ctrl-C stopped only the running job; the executor's exit then ran every queued job (hours on the full grid)
    and ended in a traceback (issue 43 item 7). Now: the queue is cancelled, the running job checkpoints, one line,
    exit 75; the same call again resumes the stopped run and runs the rest. SIGINT reaches run_all's thread (this
    process's main thread) as a terminal's Ctrl-C would; the launcher passes it on to the running job."""
    import json
    import signal
    import threading

    from cplm_megatron.checkpoint.lookup import read_latest
    from cplm_megatron.experiments.launch.launcher import RunsInterrupted

    runs = _small_runs(["first", "second", "third"])
    launcher = Launcher(tmp_path, backend="warm")
    first = launcher.run_dir(runs[0])
    main = threading.main_thread().ident

    def interrupt_once_training() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            metrics = first / "metrics.jsonl"
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
                signal.pthread_kill(main, signal.SIGINT)
                return
            time.sleep(0.05)

    threading.Thread(target=interrupt_once_training, daemon=True).start()
    try:
        with pytest.raises(RunsInterrupted) as stopped:
            launcher.run_all(runs, jobs=1)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped run_all")
    assert stopped.value.exit_code == 75, str(stopped.value)
    assert str(stopped.value) == ("[jobs] interrupted: 2 queued job(s) cancelled; running: first (stopped with a "
                                  "checkpoint); relaunch the same command to continue (finished runs are reused, "
                                  "stopped ones resume)")
    iteration = json.loads((read_latest(first / "checkpoints") / "cplm_state.json").read_text())["iteration"]
    assert 2 <= iteration < 40 and not (first / "eval.json").exists()
    assert not launcher.run_dir(runs[1]).exists() and not launcher.run_dir(runs[2]).exists()
    [done] = Launcher(tmp_path, backend="warm").run_all(runs[:1], jobs=1)
    assert done.error is None and (first / "eval.json").is_file()
    assert f"resumed from {first}/checkpoints/iter_{iteration:07d}" in (first / "train.log").read_text()


def _running(process) -> bool:
    """Whether a psutil process still runs (a zombie does not)."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _background_runner(output: Path):
    """tools/ablate.py as a script's `setsid ... &` starts it (its own process group, SIGINT ignored), once its
    first run trains: the process and that run's dir."""
    import signal
    import subprocess

    from tests import harness
    from tests.training.pretrain_utils import wait_for

    command = harness.tool_command("ablate", "--output", str(output), "--quick", "--experiments", "spamlang",
                                   "--vocab-sizes", "4096", "--spamlang-iters", "200", "--spamlang-interval", "50",
                                   "--jobs", "1", "--progress-every", "0")
    proc = subprocess.Popen(command, cwd=harness.REPO, env=harness.process_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: any(len(m.read_text().splitlines()) >= 3 for m in output.glob("runs/*/metrics.jsonl")),
                 timeout=harness.PROCESS_TIMEOUT_S, proc=proc)
    except BaseException:
        harness.kill_group(proc)
        raise
    [first] = [p.parent for p in output.glob("runs/*/metrics.jsonl")]
    return proc, first


@pytest.mark.slow
def test_a_runner_started_in_the_background_stops_its_queue_on_ctrl_c(tmp_path: Path):
    """Started in the background of a script (`setsid tools/ablate.py ... &`: SIGINT arrives ignored) and sent Ctrl-C
    as `kill -INT -- -PGID`, the runner ignored it while its trainers obeyed (exit 75), marked them FAILED, ran the
    queued jobs anyway and exited 1 with a multi-line error. Its own handling no longer depends on what it
    inherited: the queue is cancelled, the running job checkpoints, one line, exit 75."""
    import os
    import signal

    from cplm_megatron.checkpoint.lookup import read_latest
    from tests import harness

    output = tmp_path / "ablation"
    proc, first = _background_runner(output)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        harness.kill_group(proc)
    assert proc.returncode == 75, out[-3000:] + err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"[jobs] interrupted: 1 queued job(s) cancelled; running: {first.name} (stopped with a "
                     f"checkpoint); relaunch the same command to continue (finished runs are reused, stopped ones "
                     f"resume)"], err[-3000:]
    assert "FAILED" not in out, out[-3000:]
    assert [p.name for p in (output / "runs").iterdir()] == [first.name]  # the queued run never started
    assert read_latest(first / "checkpoints") is not None and not (first / "eval.json").exists()


@pytest.mark.slow
def test_sigterm_to_the_runner_and_its_forkserver_stops_the_trainer_with_a_checkpoint(tmp_path: Path):
    """`kill <runner pid> <forkserver pid>` (SIGTERM) left the running trainer training on with ppid 1, writing into
    its run dir. Now the runner's SIGTERM cancels the queue and stops its trainer, a trainer whose forkserver died
    stops as on SIGTERM, and the runner waits for it: when the runner has exited, the trainer has checkpointed
    and no process of the runner's group is left."""
    import os
    import signal

    import psutil

    from cplm_megatron.checkpoint.lookup import read_latest
    from tests import harness

    output = tmp_path / "ablation"
    proc, first = _background_runner(output)
    try:
        group = psutil.Process(proc.pid).children(recursive=True)
        [forkserver] = [c for c in psutil.Process(proc.pid).children() if "forkserver" in " ".join(c.cmdline())]
        trainers = forkserver.children()
        os.kill(proc.pid, signal.SIGTERM)
        os.kill(forkserver.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
        running_after_the_runner = [t.pid for t in trainers if _running(t)]
        deadline = time.monotonic() + 30  # the trainer's helpers (its watchdog, the resource tracker) follow it
        while (left := [c for c in group if _running(c)]) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        harness.kill_group(proc)
    assert proc.returncode in (75, 130), out[-3000:] + err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("[jobs] interrupted by SIGTERM: 1 queued job(s) cancelled; "
                                                   f"running: {first.name}"), err[-3000:]
    assert trainers and not running_after_the_runner, (running_after_the_runner, out[-3000:] + err[-3000:])
    assert not left, [(c.pid, c.cmdline()) for c in left]
    log = (first / "train.log").read_text()
    stopped = read_latest(first / "checkpoints")
    assert stopped is not None, log[-3000:]
    iteration = json.loads((stopped / "cplm_state.json").read_text())["iteration"]
    assert f"[train] stopping at iteration {iteration} (signal " in log and "exit code 75" in log, log[-3000:]
    assert [p.name for p in (output / "runs").iterdir()] == [first.name]
