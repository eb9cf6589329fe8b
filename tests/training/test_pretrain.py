"""pretrain/pretrain_cplm.py end to end on the embedded corpus, with real processes: layouts, exact
resume after kill -9, resume under another layout, crash during a save, SIGUSR1, non-finite losses;
resume safety (missing `latest`, refused fresh starts and model changes, damaged checkpoints and their
fix), SIGTERM through torchrun, and bad input as one line with exit code 2."""
import json
import os
import shutil
import signal

import pytest
import yaml

from cplm_megatron.checkpoint.lookup import list_checkpoints, read_latest
from cplm_megatron.training.signals import RESUME_EXIT_CODE
from tests import harness
from tests.trained_runs import PROBES, REFERENCE_ITERS, copy_run
from tests.training import faults
from tests.training import pretrain_utils as pu

pytestmark = [pytest.mark.mcore, pytest.mark.slow, pytest.mark.usefixtures("isolated_streaming")]
ITERS = REFERENCE_ITERS


@pytest.fixture
def reference(reference_run):
    """The session's uninterrupted run (tests/trained_runs.py): the losses every other run is compared with."""
    return reference_run



@pytest.mark.mcore_latest  # end-to-end training and resume on the newest megatron-core too
def test_uninterrupted_run_logs_and_checkpoints(reference):
    run_dir = reference["dir"]
    recs = [r for r in pu.metrics(run_dir) if "loss" in r]
    assert [r["iteration"] for r in recs] == list(range(1, ITERS + 1))
    for key in ("iteration", "loss", "objective", "lm_loss", "lr", "grad_norm", "tokens_per_sec", "mfu", "gate_mean",
                "mem_gib", "peak_mem_gib"):
        assert all(key in r for r in recs), key
    assert all(r["peak_mem_gib"] >= r["mem_gib"] > 0 for r in recs)  # getrusage's peak alone read below the RSS
    lines = [line for line in reference["stdout"].splitlines() if line.startswith("iter ")]
    assert all("| MFU" in line for line in lines)
    assert "ETA" not in lines[0] and all("| ETA " in line for line in lines[1:])  # no rate from the first step alone
    assert read_latest(run_dir / "checkpoints").name == f"iter_{ITERS:07d}"
    assert len(list_checkpoints(run_dir / "checkpoints")) == 2  # checkpoint.keep
    summary = json.loads((run_dir / "run_record.json").read_text())
    assert summary["iterations"] == ITERS and summary["tokens_per_sec"] > 0 and summary["config_hash"]
    evals = [r for r in pu.metrics(run_dir) if "val_loss" in r]
    assert [r["iteration"] for r in evals] == [5, 10] and all(r["val_ppl"] > 1 for r in evals)
    probes = [r for r in pu.metrics(run_dir) if "probe_copy_accuracy" in r]
    assert [r["iteration"] for r in probes] == [0, 5, 10]  # the untrained model too
    vocab = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["vocab_size"]
    for r in probes:  # 4 sequences of 65 tokens, a 32-token span repeated from 32 on: 32 scored tokens each
        assert 0 <= r["probe_copy_accuracy"] <= 1 and r["probe_copy_chance"] == 1 / (vocab - 1)
        assert r["probe_copy_tokens"] == 4 * 32 and abs(r["probe_in_context_score"]) < 10, r
    assert "[probe] iter 0 | copy acc" in reference["stdout"]
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline wandb run written"


@pytest.mark.parametrize("layout", [{"parallel.tp": 2}, {"parallel.pp": 2}], ids=["tp2", "pp2"])
def test_two_process_runs_learn(stdlib_corpus, tmp_path, layout, reference):
    run_dir = tmp_path / "run"
    tp = "parallel.tp" in layout
    probes = {"train.eval_interval": 5, **PROBES} if tp else {}  # the probe needs pp = 1
    proc = pu.run(2, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **layout, **probes))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = pu.losses(run_dir)
    first, last = sum(losses[i] for i in (1, 2, 3)) / 3, sum(losses[i] for i in (8, 9, 10)) / 3
    assert last < first - 0.5, losses
    if tp:  # CPU init is TP-independent; PP stages are seeded per stage (Megatron's rule)
        pu.assert_losses_match(run_dir, reference["losses"], reference["losses"])
        assert_probes_match(run_dir, reference["dir"])


def assert_probes_match(run_dir, reference_dir) -> None:
    """The probe records of a TP=2 run equal the TP=1 reference's: the same copy-task tokens right (an argmax can
    only flip on a near tie: one token allowed) and the in-context score to fp32 summation error (NLLs of a few
    nats summed over ~10^3 tokens in another order: 1e-4 absolute)."""
    def probes(path):
        return {r["iteration"]: r for r in pu.metrics(path) if "probe_copy_accuracy" in r}

    got, want = probes(run_dir), probes(reference_dir)
    assert sorted(got) == sorted(want) == [0, 5, 10]
    for it, r in got.items():
        tokens = r["probe_copy_tokens"]
        assert tokens == want[it]["probe_copy_tokens"]
        assert abs(r["probe_copy_accuracy"] - want[it]["probe_copy_accuracy"]) * tokens <= 1.0, (it, r, want[it])
        assert r["probe_in_context_score"] == pytest.approx(want[it]["probe_in_context_score"], abs=1e-4)
        text_tokens = r["probe_text_copy_tokens"]
        assert text_tokens == want[it]["probe_text_copy_tokens"] > 0
        for key in ("probe_text_copy_accuracy", "probe_text_copy_first_accuracy"):
            assert abs(r[key] - want[it][key]) * text_tokens <= 1.0, (it, key, r, want[it])


@pytest.mark.mcore_latest  # end-to-end training and resume on the newest megatron-core too
def test_kill_9_then_restart_resumes_exactly(stdlib_corpus, tmp_path, reference):
    run_dir = tmp_path / "run"
    overrides = pu.tiny_overrides(stdlib_corpus, run_dir, ITERS)
    proc = pu.start(1, overrides, tmp_path / "first.log")
    pu.wait_for(lambda: (run_dir / "checkpoints" / "latest").exists() and max(pu.losses(run_dir), default=0) >= 4,
                proc=proc)
    pu.kill_group(proc)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(pu.losses(run_dir))
    assert killed_at < ITERS
    again = pu.run(1, overrides)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout
    # bit-exact on CPU, every iteration (the reference also validated: evaluation leaves training untouched)
    assert pu.losses(run_dir) == reference["losses"]


@pytest.mark.mcore_latest
@pytest.mark.parametrize("resume_layout, nproc", [({}, 1), ({"parallel.pp": 2}, 2)], ids=["tp2-to-tp1", "tp2-to-pp2"])
def test_resume_tp2_checkpoint_under_another_layout(stdlib_corpus, tmp_path, reference, resume_layout, nproc):
    run_dir = tmp_path / "run"
    first = pu.run(2, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{"parallel.tp": 2, "train.exit_after_iters": 4}))
    assert pu.stopped_for_resume(first.returncode, first.stderr), first.stderr[-3000:]
    assert read_latest(run_dir / "checkpoints").name == "iter_0000004"
    second = pu.run(nproc, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **resume_layout))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "(new layout)" in second.stdout
    pu.assert_losses_match(run_dir, reference["losses"], range(5, ITERS + 1))


@pytest.mark.mcore_latest  # end-to-end training and resume on the newest megatron-core too
def test_async_saves_at_tp2_are_complete_and_resumable(stdlib_corpus, tmp_path, reference):
    """checkpoint.async_save: saves at 3 and 6 finish in the background while training goes on, the exit
    save at 7 is finalized before the process exits, and a TP=1 run resumes from it."""
    run_dir = tmp_path / "run"
    first = pu.run(2, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{
        "parallel.tp": 2, "checkpoint.async_save": "true", "train.exit_after_iters": 7}))
    assert pu.stopped_for_resume(first.returncode, first.stderr), first.stderr[-3000:]
    assert "writing" in first.stdout and "in the background" in first.stdout
    ckpts = run_dir / "checkpoints"
    assert [c.name for c in list_checkpoints(ckpts)] == ["iter_0000006", "iter_0000007"]  # keep=2
    assert read_latest(ckpts).name == "iter_0000007"
    tokens_per_step = 4 * stdlib_corpus.train.seq_len  # train.global_batch x seq_len
    for it in (6, 7):  # the record is the state at save time, not the trainer's when the save finished
        record = json.loads((ckpts / f"iter_{it:07d}" / "cplm_state.json").read_text())
        assert record["iteration"] == it and record["consumed_tokens"] == it * tokens_per_step, record
        assert f"saved {ckpts}/iter_{it:07d} (iteration {it})" in first.stdout
    second = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "iter_0000007" in second.stdout
    pu.assert_losses_match(run_dir, reference["losses"], range(1, ITERS + 1))


def test_crash_during_save_keeps_latest_on_the_previous_checkpoint(stdlib_corpus, tmp_path, reference):
    run_dir = tmp_path / "run"
    overrides = pu.tiny_overrides(stdlib_corpus, run_dir, ITERS)
    crashed = pu.run(1, overrides, fault=("crash_during_save", 6))
    assert crashed.returncode == faults.CRASH_EXIT_CODE, crashed.stderr[-2000:]
    assert read_latest(run_dir / "checkpoints").name == "iter_0000003"
    partial = run_dir / "checkpoints" / "iter_0000006"
    assert partial.is_dir() and not (partial / "cplm_state.json").exists()
    again = pu.run(1, overrides)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout and "iter_0000003" in again.stdout
    assert pu.losses(run_dir) == reference["losses"]
    assert (run_dir / "checkpoints" / "iter_0000009" / "cplm_state.json").exists()


def test_sigusr1_saves_and_exits_with_resume_code(stdlib_corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = pu.tiny_overrides(stdlib_corpus, run_dir, 200, **{"checkpoint.interval": 0})
    proc = pu.start(2, overrides + ["parallel.tp=2"], tmp_path / "run.log")
    pu.wait_for(lambda: max(pu.losses(run_dir), default=0) >= 2, proc=proc)
    for pid in pu.worker_pids(proc):
        os.kill(pid, signal.SIGUSR1)
    proc.wait(timeout=300)
    pu.kill_group(proc)  # leftovers only; the run itself has exited
    log = (tmp_path / "run.log").read_text()
    assert pu.stopped_for_resume(proc.returncode, log), log[-3000:]
    stopped = read_latest(run_dir / "checkpoints")
    assert stopped is not None and 2 <= json.loads((stopped / "cplm_state.json").read_text())["iteration"] < 200


def test_baseline_and_cplm_differ_only_in_the_head(stdlib_corpus, tmp_path, reference):
    run_dir = tmp_path / "baseline"
    proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 3, **{"copy_head.enabled": "false",
                                                                     "train.eval_interval": 5, "logging.wandb": "true"}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    base_cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cplm_cfg = yaml.safe_load((reference["dir"] / "config.yaml").read_text())
    diff = {(s, k) for s in cplm_cfg for k in cplm_cfg[s] if cplm_cfg[s][k] != base_cfg[s][k]}
    probes = {("train", k) for k in ("probe_interval", "probe_sequences", "probe_copy_length")}  # read, not trained
    assert diff <= {("copy_head", "enabled"), ("run", "dir"), ("train", "iters")} | probes, diff
    base, cplm = (next(r for r in pu.metrics(d) if "loss" in r) for d in (run_dir, reference["dir"]))  # probes first
    assert base["lm_loss"] == cplm["lm_loss"]  # same backbone init, same first batch
    assert "gate_mean" not in base and base["loss"] == base["lm_loss"] == base["objective"]
    # Both print the same quantity under `loss`, the output distribution's NLL (the mixture's for the CPLM: its
    # objective minus the LM head's auxiliary cross entropy); the CPLM's objective is labelled apart.
    weight = cplm_cfg["copy_head"]["lm_loss_weight"]
    assert weight > 0 and abs(cplm["objective"] - cplm["loss"] - weight * cplm["lm_loss"]) < 1e-4
    assert cplm["loss"] < base["loss"] < cplm["objective"]  # the mixture copies from step 1; the objective adds ~ln V
    base_line = next(line for line in proc.stdout.splitlines() if line.startswith("iter 1/"))
    cplm_line = next(line for line in reference["stdout"].splitlines() if line.startswith("iter 1/"))
    assert base_line.startswith(f"iter 1/3 | loss {base['loss']:.4f} | lr") and "host mem" in base_line
    assert cplm_line.startswith(f"iter 1/{ITERS} | loss {cplm['loss']:.4f} | lm-head {cplm['lm_loss']:.4f} | "
                                f"objective {cplm['objective']:.4f} (loss + {weight:g}×lm-head) | gate"), cplm_line
    from cplm_megatron.checkpoint.weights import load_plain_tensors

    b = {k for k, v in load_plain_tensors(read_latest(run_dir / "checkpoints")).items()
         if hasattr(v, "shape") and not k.startswith("optimizer")}
    c = {k for k, v in load_plain_tensors(read_latest(reference["dir"] / "checkpoints")).items()
         if hasattr(v, "shape") and not k.startswith("optimizer")}
    assert c - b == {k for k in c if k.startswith("copy_head.")} and b <= c


def test_nonfinite_losses_are_skipped_then_abort(stdlib_corpus, tmp_path):
    run_dir = tmp_path / "run"
    proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 20, **{
        "train.lr": 1e30, "train.min_lr": 1e30, "schedule.warmup_iters": 0, "optimizer.clip_grad": 0,
        "train.max_nonfinite_steps": 3, "checkpoint.interval": 0}))
    assert proc.returncode == 1
    assert "step skipped" in proc.stdout and "non-finite for 3 consecutive steps" in proc.stderr
    assert read_latest(run_dir / "checkpoints") is None  # nothing saved from the diverged state


def test_fp16_trains_through_the_loss_scalers_warm_up(tmp_path):
    """fp16: the loss scaler skips ~20-30 steps from its initial scale (2**32) with finite losses; they are said to be
    overflows and not counted as non-finite losses (every fp16 run exited 1 at iteration 5 before)."""
    proc = pu.run(1, [f"run.dir={tmp_path / 'run'}", "precision.dtype=fp16", "data.synthetic=copy", "train.iters=30",
                      "model.vocab_size=256", "train.seq_len=64", "train.micro_batch=2", "train.global_batch=2",
                      "train.log_interval=5", "train.eval_interval=0", "logging.wandb=false",
                      "checkpoint.enabled=false"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[train] iteration 1: gradients overflowed fp16 at loss scale 4.29497e+09" in proc.stdout
    assert "step taken at loss scale" in proc.stdout and "non-finite loss" not in proc.stdout
    assert "[train] done: 30 iterations" in proc.stdout


@pytest.mark.mcore_latest  # end-to-end training and resume on the newest megatron-core too
def test_bf16_tp2_saves_and_resumes(tmp_path):
    """Mixed precision (bf16 params, fp32 main params/grads): save at TP=2, resume, keep learning."""
    run_dir = tmp_path / "run"
    common = [f"run.dir={run_dir}", "precision.dtype=bf16", "parallel.tp=2", "data.synthetic=copy",
              "train.iters=6", "train.seq_len=128", "train.micro_batch=2", "train.global_batch=4",
              "train.log_interval=1", "train.eval_interval=0", "copy_head.head_dim=16", "logging.wandb=false",
              "checkpoint.interval=3"]
    first = pu.run(2, common + ["train.exit_after_iters=3"])
    assert pu.stopped_for_resume(first.returncode, first.stderr), first.stderr[-3000:]
    second = pu.run(2, common)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "resumed from" in second.stdout and "(same layout)" in second.stdout
    losses = pu.losses(run_dir)
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]


def test_validation_loss_is_the_full_distribution_not_the_objective(stdlib_corpus, tmp_path):
    """With an auxiliary LM loss the optimized objective is mixture NLL + w x LM CE; val_loss must stay the
    mixture's NLL (what the model assigns to the data), val_objective the sum."""
    run_dir = tmp_path / "run"
    proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 2, **{
        "train.eval_interval": 2, "copy_head.lm_loss_weight": 1, "checkpoint.enabled": "false"}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [val] = [r for r in pu.metrics(run_dir) if "val_loss" in r]
    # per-token sums over the same tokens, reduced in fp64: equal up to fp32 rounding of the per-token terms
    assert val["val_objective"] == pytest.approx(val["val_loss"] + val["val_lm_loss"], rel=1e-6)
    assert val["val_lm_loss"] > 1.0  # so the check above fails if val_loss were the objective


# ---------------------------------------------------------------- resume safety: nothing lost, nothing silent

@pytest.fixture
def stopped_at_4(stopped_run):
    """The session's run stopped after 4 iterations (tests/trained_runs.py); tests copy it before changing it."""
    return stopped_run



def test_missing_latest_resumes_from_the_newest_checkpoint_and_a_fresh_start_is_refused(
        stdlib_corpus, tmp_path, stopped_at_4, reference):
    run_dir = copy_run(stopped_at_4, tmp_path)
    (run_dir / "checkpoints" / "latest").unlink()
    before = pu.files_of(run_dir)
    refused = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{"checkpoint.resume": "false"}))
    pu.assert_bad_input(refused, "checkpoint.resume=false but", "holds checkpoints of an earlier run",
                        "checkpoint.overwrite=true")
    assert pu.files_of(run_dir) == before  # no config.yaml rewritten, no checkpoint touched
    again = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{run_dir}/checkpoints/latest is missing: using the newest complete checkpoint iter_0000004" in again.stdout
    assert f"resumed from {run_dir}/checkpoints/iter_0000004 at iteration 4" in again.stdout
    assert pu.losses(run_dir) == reference["losses"]  # iterations 1-4 from the first launch, 5-10 resumed exactly


def test_overwrite_starts_over_when_asked(stdlib_corpus, tmp_path, stopped_at_4):
    run_dir = copy_run(stopped_at_4, tmp_path)
    fresh = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 3, **{"checkpoint.resume": "false",
                                                                     "checkpoint.overwrite": "true"}))
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert f"checkpoint.overwrite=true: deleted the checkpoints in {run_dir}/checkpoints" in fresh.stdout
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["iter_0000003"]
    assert json.loads((run_dir / "checkpoints" / "iter_0000003" / "cplm_state.json").read_text())["iteration"] == 3


def test_changed_model_is_refused_and_schedule_changes_take_effect(stdlib_corpus, tmp_path, stopped_at_4, reference):
    run_dir = copy_run(stopped_at_4, tmp_path)
    before = pu.files_of(run_dir)
    baseline = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{"copy_head.enabled": "false"}))
    pu.assert_bad_input(baseline, "cannot resume from", "(copy_head.enabled: True -> False)",
                        "train this model from scratch in a new run dir")
    shallower = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{"model.num_layers": 2}))
    line = pu.assert_bad_input(shallower, "(model.num_layers: 4 -> 2)", "train this model from scratch in a new run dir",
                               "no checkpoint.load can take them")
    assert "checkpoint.load=" not in line  # another model size: its weights cannot be loaded, so it is not suggested
    other_loss = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{"copy_head.lm_loss_weight": 0.5}))
    pu.assert_bad_input(other_loss, "(copy_head.lm_loss_weight: 1.0 -> 0.5)",
                        "checkpoint.load_optimizer=false")  # same tensors: starting from these weights works
    assert pu.files_of(run_dir) == before  # config.yaml still the run's own, checkpoints untouched
    longer = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 12))
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "[train] changed since iter_0000004: run.dir" in longer.stdout and "train.iters: 10 -> 12" in longer.stdout
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["iters"] == 12
    # WSD: the last 20% of the iterations decay. Iteration 10 runs with the LR after 9 scheduler steps: still the
    # peak (train.lr) for 12 iterations, already decaying in the 10-iteration schedule the checkpoint saved.
    # rel 1e-12: Megatron computes the peak as min_lr + 1.0 * (max_lr - min_lr), exact up to one rounding.
    lr = {r["iteration"]: r["lr"] for r in pu.metrics(run_dir) if "lr" in r}
    reference_lr = {r["iteration"]: r["lr"] for r in pu.metrics(reference["dir"]) if "lr" in r}
    peak = yaml.safe_load((pu.REPO / "configs" / "tiny.yaml").read_text())["train"]["lr"]
    assert lr[10] == pytest.approx(peak, rel=1e-12) and reference_lr[10] < peak


@pytest.mark.parametrize("damage, what", [
    ("__0_0.distcp", "shard file __0_0.distcp is missing"),
    ("common.pt", "common.pt (iteration, scheduler, data position, config) is missing"),
    ("flip:__0_0.distcp", "__0_0.distcp differs from its checksum (xxh3_128) recorded when it was saved"),
], ids=["shard", "common", "flipped-bytes"])
def test_damaged_checkpoint_names_the_fix_and_the_fix_works(stdlib_corpus, tmp_path, stopped_at_4, reference,
                                                            damage, what):
    """A missing file, or 4 KiB flipped inside a shard (loaded without a word before its checksums were kept: the
    resumed losses differed and pruning then deleted the last intact checkpoint): one line naming the previous
    intact checkpoint; following it resumes exactly and keeps the damaged one aside."""
    run_dir = copy_run(stopped_at_4, tmp_path)
    target = run_dir / "checkpoints" / "iter_0000004" / damage.removeprefix("flip:")
    if damage.startswith("flip:"):
        data = bytearray(target.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 4096] = bytes(b ^ 0xFF for b in data[middle:middle + 4096])
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    overrides = pu.tiny_overrides(stdlib_corpus, run_dir, ITERS)
    damaged = pu.run(1, overrides)
    fix = f"echo iter_0000003 > {run_dir}/checkpoints/latest"
    pu.assert_bad_input(damaged, f"checkpoint {run_dir}/checkpoints/iter_0000004 is damaged: {what}", fix)
    (run_dir / "checkpoints" / "latest").write_text("iter_0000003\n")  # the fix, as the message says
    again = pu.run(1, overrides)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "the newer checkpoints (iter_0000004) are kept in" in again.stdout  # a rollback: moved aside
    [aside] = (run_dir / "checkpoints").glob("set_aside_*")
    assert (aside / "iter_0000004" / "cplm_state.json").is_file()
    assert pu.losses(run_dir) == reference["losses"]  # iteration 4 trained again from iter_0000003: the same


@pytest.mark.parametrize("target", ["launcher", "torchrun"])
def test_sigterm_to_a_torchrun_launch_exits_75_with_a_checkpoint(stdlib_corpus, tmp_path, target):
    """pretrain/launch_torchrun.py keeps the workers' exit code: SIGTERM to it (forwarded to the workers) or to
    torchrun itself (torchrun forwards it) ends in a checkpoint and exit 75, where plain torchrun exits 1. Its
    start is quiet: at most 3 lines before the first training line."""
    import psutil

    run_dir = tmp_path / "run"
    overrides = pu.tiny_overrides(stdlib_corpus, run_dir, 200, **{"checkpoint.interval": 0, "parallel.tp": 2})
    # Python's default warning filters, as a user's shell has them (the harness's processes ignore warnings)
    proc = pu.start(2, overrides, tmp_path / "run.log", launcher=True, extra_env={"PYTHONWARNINGS": ""})
    pu.wait_for(lambda: max(pu.losses(run_dir), default=0) >= 2, proc=proc)
    if target == "launcher":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        [torchrun] = psutil.Process(proc.pid).children()
        torchrun.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    pu.kill_group(proc)  # leftovers only
    log = (tmp_path / "run.log").read_text()
    assert proc.returncode == RESUME_EXIT_CODE, log[-3000:]
    assert "[launch_torchrun] torchrun exited 1; workers: {0: 75, 1: 75}; exit code 75" in log
    # a quiet start (the README's launch, 2 ranks, TP=2): no torchrun banner, no [compat] line, no megatron-core
    # warnings; at most 3 lines before the first training line (details: --verbose, CPLM_VERBOSE=1)
    start = log[:log.index("\niter 1/200 ")].splitlines()
    assert len(start) <= 3 and not any("Warning" in line or "[compat]" in line or "OMP_NUM_THREADS" in line
                                       for line in start), start
    stopped = read_latest(run_dir / "checkpoints")
    assert stopped is not None and 2 <= json.loads((stopped / "cplm_state.json").read_text())["iteration"] < 200


def test_bad_input_under_torchrun_exits_2(stdlib_corpus, tmp_path):
    proc = pu.run(2, pu.tiny_overrides(stdlib_corpus, tmp_path / "run", 3, **{"data.streams": str(tmp_path / "none")}),
                  launcher=True)
    assert proc.returncode == 2 and proc.stderr.count(f"error: dataset directory not found: {tmp_path}/none") == 2


@pytest.mark.parametrize("overrides, message", [
    ({"train.global_batch": 6}, "train.global_batch=6 must be a multiple of train.micro_batch * data-parallel size "
                                "= 2 * 2 = 4"),
    ({"parallel.pp": 2, "model.num_layers": 3}, "model.num_layers=3 is not divisible by parallel.pp=2"),
], ids=["global-batch", "layers"])
def test_layout_and_batch_errors_stop_before_any_process_group(stdlib_corpus, tmp_path, overrides, message):
    """Rank 0 of a 2-process world whose rank 1 never starts: a check after init_process_group would wait for
    rank 1 until the run's timeout; done before, it is an immediate exit 2."""
    world = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(pu.free_port())}
    proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, tmp_path / "run", 3, **overrides), extra_env=world, timeout=300)
    pu.assert_bad_input(proc, message)
    assert not (tmp_path / "run").exists()


def test_dataset_errors_are_one_line_and_exit_2(stdlib_corpus, tmp_path):
    missing = pu.run(1, pu.tiny_overrides(stdlib_corpus, tmp_path / "a", 3, **{"data.streams": str(tmp_path / "no")}))
    pu.assert_bad_input(missing, f"dataset directory not found: {tmp_path}/no")
    damaged = shutil.copytree(stdlib_corpus.train_dir, tmp_path / "train", ignore=shutil.ignore_patterns("*.tmp"))
    shard = sorted(damaged.glob("shard.*.mds.zstd"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    broken = pu.run(1, pu.tiny_overrides(stdlib_corpus, tmp_path / "b", 3, **{"data.streams": str(damaged)}))
    pu.assert_bad_input(broken, f"shard corrupt: {shard} has 100 bytes", "re-run tools/prepare_data.py")


def test_a_corrupt_shard_unverified_at_start_is_one_line_exit_2_and_no_run_dir(stdlib_corpus, tmp_path):
    """data.verify_shards=false and a shard altered at the same size: streaming's checksum fails in its download
    thread when the first batch is drawn (an 85-line traceback, exit 1, and a new run dir, before issue 30); the
    first step's batches are drawn before run.dir is written, and the failure is one line naming the shard."""
    damaged = shutil.copytree(stdlib_corpus.train_dir, tmp_path / "train",  # as shipped: no decompressed copies
                              ignore=shutil.ignore_patterns("*.tmp", "*.mds"))
    shard = sorted(damaged.glob("shard.*.mds.zstd"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 64])
    shard.write_bytes(bytes(data))
    run_dir = tmp_path / "run"
    proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 3, **{"data.streams": str(damaged),
                                                                      "data.verify_shards": "false"}))
    pu.assert_bad_input(proc, f"shard corrupt: {shard} does not match the checksum", "re-run tools/prepare_data.py",
                        "data.verify_shards=true")
    assert not run_dir.exists()


def test_finetuning_from_another_run_leaves_it_untouched(stdlib_corpus, tmp_path, stopped_at_4, reference):
    """checkpoint.load + load_optimizer=false in a new run.dir: the weights of iter_0000004, a fresh optimizer and
    schedule, iteration 0; settings that change no tensor may differ; the source run is not modified."""
    source = copy_run(stopped_at_4, tmp_path, "source")
    before = pu.files_of(source)
    run_dir = tmp_path / "finetune"
    proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 2, **{
        "checkpoint.load": str(source), "checkpoint.load_optimizer": "false", "model.rope_theta": 20000}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"started from {source}/checkpoints/iter_0000004 at iteration 0" in proc.stdout
    assert "changed since iter_0000004: model.rope_theta: 10000.0 -> 20000" in proc.stdout
    losses = pu.losses(run_dir)
    assert sorted(losses) == [1, 2] and losses[1] < reference["losses"][1]  # trained weights, not a fresh init
    assert pu.files_of(source) == before


# ---------------------------------------------------------------- nothing lost, nothing silent: round 2 (issue 21)

def test_refused_relaunches_leave_the_run_dir_unchanged(stdlib_corpus, tmp_path, stopped_at_4):
    """Every check runs before the first write: a data stream that does not fit the checkpoint (refused by the
    data loader once the model and the data are built) leaves config.yaml alone, and checkpoint.overwrite=true
    with a typo in data.streams deletes nothing (the delete comes after every check)."""
    run_dir = shutil.copytree(stopped_at_4, tmp_path / "run")
    before = pu.files_of(run_dir)
    other = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{"data.streams": str(stdlib_corpus.val_dir)}))
    pu.assert_bad_input(other, "the checkpoint's data epoch had", "the datasets or mixture changed")
    assert pu.files_of(run_dir) == before
    typo = f"{stdlib_corpus.train_dir}x"
    overwrite = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{
        "checkpoint.resume": "false", "checkpoint.overwrite": "true", "data.streams": typo}))
    pu.assert_bad_input(overwrite, f"dataset directory not found: {typo}")
    assert pu.files_of(run_dir) == before  # every checkpoint still there


def _main_in_process(capsys, argv) -> tuple:
    """pretrain_cplm.main(argv) in this process (the refusals tested here come before any process group)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pretrain_cplm_entry", harness.PRETRAIN)
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    capsys.readouterr()
    code = entry.main(argv)
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip() and not line.startswith("[compat] ")]
    return code, lines


def test_config_disk_and_memory_refusals_are_one_line_and_write_nothing(stdlib_corpus, tmp_path, stopped_at_4,
                                                                         capsys):
    run_dir = shutil.copytree(stopped_at_4, tmp_path / "run")
    before = pu.files_of(run_dir)
    recipe = str(pu.REPO / "configs" / "tiny.yaml")
    base = pu.tiny_overrides(stdlib_corpus, run_dir, ITERS)
    tabbed = tmp_path / "tabbed.yaml"
    tabbed.write_text((pu.REPO / "configs" / "tiny.yaml").read_text() + "train:\n\titers: 3\n")
    twice = tmp_path / "twice.yaml"
    twice.write_text("train:\n  iters: 3\n  iters: 4\n")
    fresh = tmp_path / "fresh"
    huge = ["model.num_layers=96", "model.hidden_size=16384", "model.ffn_hidden_size=65536",
            "model.num_attention_heads=128"]  # ~300B parameters: ~5 TB per checkpoint, ~5 TB of memory
    cases = [
        (["--config", str(tabbed), "--set", *base], f"{tabbed}:"),
        (["--config", str(twice), "--set", *base], f"{twice}:3:3: key 'iters' is given twice"),
        (["--config", recipe, "--set", *base, "train.iters=-5"], "train.iters must be >= 1, got -5"),
        (["--config", recipe, "--set", *base[1:], "run.dir=/proc/cplm-run"], "run.dir /proc/cplm-run is not writable"),
        (["--config", recipe, "--set", *base[1:], f"run.dir={fresh}", *huge],
         "not enough disk space for checkpoints"),
        (["--config", recipe, "--set", *base[1:], f"run.dir={fresh}", *huge, "checkpoint.enabled=false"],
         "the model does not fit: the planner (tools/model_info.py) estimates"),
    ]
    for argv, fragment in cases:
        code, lines = _main_in_process(capsys, argv)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv[-1], lines)
        assert fragment in lines[0], (fragment, lines[0])
    assert "(YAML indents with spaces, not tabs)" in _main_in_process(capsys, cases[0][0])[1][0]
    disk = _main_in_process(capsys, cases[4][0])[1][0]
    assert "a save needs room for two" in disk and "TiB" in disk
    memory = _main_in_process(capsys, cases[5][0])[1][0]
    assert "the host has" in memory and "train.micro_batch" in memory and "run.check_memory=false" in memory
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "checkpoints").write_text("x")  # a checkpoint dir that cannot be created
    code, lines = _main_in_process(capsys, ["--config", recipe, "--set", *base[1:], f"run.dir={blocked}"])
    assert code == 2 and f"checkpoint dir {blocked}/checkpoints exists and is not a directory" in lines[0], lines
    assert pu.files_of(blocked) == {"checkpoints": b"x"}
    assert pu.files_of(run_dir) == before
    assert not fresh.exists()


def test_a_checkpoint_committed_before_latest_moved_is_resumed_automatically(stdlib_corpus, tmp_path, stopped_at_4,
                                                                             reference):
    """A crash after iter_0000004 committed, before `latest` (and the trainer's record of it) moved."""
    run_dir = shutil.copytree(stopped_at_4, tmp_path / "run")
    for name in ("latest", "latest.trainer"):
        (run_dir / "checkpoints" / name).write_text("iter_0000003\n")
    again = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (f"iter_0000004 is complete but newer than {run_dir}/checkpoints/latest (iter_0000003): the run stopped "
            "before moving latest; resuming from iter_0000004") in again.stdout
    assert pu.losses(run_dir) == reference["losses"]


@pytest.mark.parametrize("launch", ["python", "torchrun", "launcher"])
def test_ctrl_c_saves_a_checkpoint_and_exits_75(stdlib_corpus, tmp_path, launch):
    """SIGINT to the whole process group, as a terminal's Ctrl-C: the python process (or torchrun and its
    workers, which receive it twice: from the terminal and from torchrun; or pretrain/launch_torchrun.py, which
    forwards it) checkpoint at the next step boundary."""
    run_dir = tmp_path / "run"
    extra = {"checkpoint.interval": 0, **({"parallel.tp": 2} if launch != "python" else {})}
    nproc = 2 if launch != "python" else 1
    proc = pu.start(nproc, pu.tiny_overrides(stdlib_corpus, run_dir, 200, **extra), tmp_path / "run.log",
                    mode=launch)  # the launch path itself: python, torchrun or the launcher
    pu.wait_for(lambda: max(pu.losses(run_dir), default=0) >= 2, proc=proc)
    pu.kill_group(proc, signal.SIGINT)
    proc.wait(timeout=300)
    pu.kill_group(proc)  # leftovers only
    log = (tmp_path / "run.log").read_text()
    stopped = read_latest(run_dir / "checkpoints")
    assert stopped is not None, log[-3000:]
    it = json.loads((stopped / "cplm_state.json").read_text())["iteration"]
    sig = signal.SIGUSR1 if launch == "launcher" else signal.SIGINT  # the launcher forwards it as SIGUSR1
    assert 2 <= it < 200 and f"[train] stopping at iteration {it} (signal {int(sig)}); exit code 75" in log, log[-3000:]
    if launch == "launcher":  # the launcher turns the Ctrl-C into SIGUSR1 for the workers and keeps their 75
        assert proc.returncode == RESUME_EXIT_CODE and "[launch_torchrun] SIGINT: asking 2 workers" in log, log[-3000:]
        return
    assert "SIGINT: saving a checkpoint at the next step boundary" in log
    if launch == "python":
        assert proc.returncode == RESUME_EXIT_CODE and "Traceback" not in log, log[-3000:]
    else:  # plain torchrun reports the signal as its own failure (its SignalException) after the workers saved
        assert proc.returncode == 1, log[-3000:]


def test_a_dead_async_writer_is_one_line_exit_1_and_no_orphans(stdlib_corpus, tmp_path):
    import psutil

    from cplm_megatron.checkpoint.lookup import verify_checkpoint

    run_dir = tmp_path / "run"
    proc = pu.start(1, pu.tiny_overrides(stdlib_corpus, run_dir, ITERS, **{"checkpoint.async_save": "true",
                                                                            "logging.wandb": "true"}),
                    tmp_path / "run.log", fault=("kill_async_writer", 6), mode="python")  # process ownership
    proc.wait(timeout=300)
    log = (tmp_path / "run.log").read_text()

    def group():
        return [p for p in psutil.process_iter() if _pgid(p.pid) == proc.pid]
    try:  # multiprocessing's resource tracker takes a moment to clean up after its parent exits
        pu.wait_for(lambda: not group(), timeout=15)
    except TimeoutError:
        pass
    left = group()
    pu.kill_group(proc)
    assert proc.returncode == 1, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "the background checkpoint writer of" in errors[0] and "iter_0000006" in errors[0]
    assert "killed by SIGKILL" in errors[0] and "latest still names iter_0000003" in errors[0], errors
    assert "Traceback" not in log, log[-3000:]  # nor wandb's atexit hook's, its service killed from under it
    assert not left, [p.cmdline() for p in left]  # no orphaned Manager, writer or wandb service
    assert verify_checkpoint(read_latest(run_dir / "checkpoints")).iteration == 3


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1


# ---------------------------------------------------------------- nothing lost, nothing silent: round 4 (issue 43)

def test_sigterm_while_waiting_for_the_dataset_lock_stops_at_once(stdlib_corpus, tmp_path, mounts):
    """Another job on the machine holds the dataset lock (it is opening its datasets): SIGTERM was ignored until the
    lock was released (up to 900 s). Now the wait ends at once: one line, exit 75, nothing written. /dev/shm is
    private to the test (a tmpfs in its own mount namespace), so the machine's lock is not touched."""
    import fcntl
    from pathlib import Path

    mounts.tmpfs(Path("/dev/shm"), "64m")
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    with open(mounts.seen(Path("/dev/shm/cplm-streaming-open.lock")), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = harness.start_pretrain(1, pu.tiny_overrides(stdlib_corpus, run_dir, 3), log,
                                      script=mounts.script(harness.PRETRAIN))
        try:
            pu.wait_for(lambda: "waiting for the dataset lock" in log.read_text(), timeout=120)
            for pid in pu.worker_pids(proc):
                os.kill(pid, signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            pu.kill_group(proc)
    text = log.read_text()
    assert proc.returncode == RESUME_EXIT_CODE, text[-3000:]
    assert "[train] stopped by signal 15 after" in text and "waiting for the dataset lock" in text, text[-3000:]
    assert "Traceback" not in text and not run_dir.exists(), text[-3000:]
