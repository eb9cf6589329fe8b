"""The session's trained runs: each is trained once per test session (once for all its xdist workers) and shared
by every test that needs it.

* `reference_run`: the tiny recipe on the embedded corpus, 10 iterations at TP=1 in one interpreter (the README's
  first command: `python pretrain/pretrain_cplm.py`), validated and probed (PROBES) at 5 and 10, wandb offline,
  checkpoints at 3, 6, 9 and 10 (keep 2). Its losses are what the resume and layout tests compare with.
* `stopped_run`: the same recipe stopped after 4 iterations (`train.exit_after_iters`, exit 75): checkpoints
  iter_0000003 and iter_0000004 (latest). Tests that resume or damage it copy it first (`copy_run`).
* `runs` / `hf_exports`: a tiny baseline and CPLM pair on synthetic copy data and their HF exports
  (tests/evaluation/runs.py), for the evaluation, HF and tool tests; `packed_val`, a validation set in their
  vocabulary and sequence length.
A test that modifies a run works on `copy_run(run, tmp_path)`, never on the shared directory.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from cplm_megatron.training.signals import RESUME_EXIT_CODE

REFERENCE_ITERS = 10
DONE = "built"  # the marker of a finished build (built_once)
# the in-training probe (evaluation/probes.py) of the reference run, at its validation cadence
PROBES = {"train.probe_interval": 5, "train.probe_sequences": 4, "train.probe_copy_length": 64}


def copy_run(run_dir: Path, tmp_path: Path, name: str = "run") -> Path:
    """A private copy of a shared run (for a test that resumes, damages or relaunches it)."""
    return Path(shutil.copytree(run_dir, tmp_path / name))


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`name`'s folder, built by `build(folder)` once per test session: under pytest-xdist every worker shares it
    (the first to ask builds it under a file lock, the others wait and reuse it; a failed build is retried afresh)."""
    base = factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once" / name
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{root}.lock"):
        if not (root / DONE).is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            (root / DONE).write_text("ok\n")
    return root


@pytest.fixture(scope="session")
def reference_run(stdlib_corpus, tmp_path_factory) -> dict:
    """One uninterrupted single-process run: {'dir', 'losses', 'stdout'} (read only)."""
    from tests.training import pretrain_utils as pu

    def build(root: Path) -> None:
        proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, root / "run", REFERENCE_ITERS, **{
            "train.eval_interval": 5, "logging.wandb": "true", **PROBES}), mode="python")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (root / "stdout.txt").write_text(proc.stdout)

    root = built_once(tmp_path_factory, "reference", build)
    return {"dir": root / "run", "losses": pu.losses(root / "run"), "stdout": (root / "stdout.txt").read_text()}


@pytest.fixture(scope="session")
def stopped_run(stdlib_corpus, tmp_path_factory) -> Path:
    """The reference recipe stopped after 4 iterations: checkpoints iter_0000003 and iter_0000004 (latest)."""
    from cplm_megatron.checkpoint.lookup import list_checkpoints
    from tests.training import pretrain_utils as pu

    def build(root: Path) -> None:
        proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, root / "run", REFERENCE_ITERS,
                                           **{"train.exit_after_iters": 4}))
        assert proc.returncode == RESUME_EXIT_CODE, proc.stderr[-3000:]

    run_dir = built_once(tmp_path_factory, "stopped", build) / "run"
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["iter_0000003", "iter_0000004"]
    return run_dir


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{'baseline': run dir, 'cplm': run dir} on synthetic copy data (tests/evaluation/runs.py)."""
    from tests.evaluation.runs import NAMES, train_pair

    root = built_once(tmp_path_factory, "evaluation-runs", train_pair)
    return {name: root / name for name in NAMES}


@pytest.fixture(scope="session")
def hf_exports(runs: dict[str, Path], tiny_corpus, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tools/convert_to_hf.py exports of both runs (CPLMForCausalLM / LlamaForCausalLM)."""
    from tests.evaluation.runs import export_hf

    root = built_once(tmp_path_factory, "evaluation-exports",
                      lambda folder: export_hf(runs, folder, tiny_corpus.tokenizer_dir))
    return {name: root / name for name in runs}


@pytest.fixture(scope="session")
def packed_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared dataset of short random documents (5-40 tokens), packed several to a sample of the pair's length."""
    import torch

    from tests.data_fixtures import synthetic_tokenizer, write_synthetic_dataset
    from tests.evaluation.runs import SEQ_LEN, VOCAB

    g = torch.Generator().manual_seed(7)
    docs = [torch.randint(1, VOCAB, (int(torch.randint(5, 41, (1,), generator=g)),), generator=g).tolist()
            for _ in range(80)]
    path = tmp_path_factory.mktemp("packed-val")
    write_synthetic_dataset(path, docs, SEQ_LEN, synthetic_tokenizer(VOCAB))
    return path
