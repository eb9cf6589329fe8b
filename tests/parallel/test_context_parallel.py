"""Context parallelism (parallel.cp) without Transformer Engine: the load-balanced split, the copy kernels with
global query positions, the layout checks, and (slow, real gloo processes) the copy head, SDPA attention and
training at CP=2 against CP=1."""
from __future__ import annotations

import json

import pytest
import torch

import cplm_kernels
from cplm_megatron.parallel.context import local_positions

pytestmark = pytest.mark.mcore  # megatron-core's CP groups and batch split (both CI legs for the fast tests)


def test_local_positions_are_megatrons_load_balanced_split():
    """Rank r of N holds chunks r and 2N-1-r of 2N (megatron.core.utils.get_batch_on_this_cp_rank's view)."""
    seq, n = 16, 2
    x = torch.arange(seq)
    for r in range(n):
        chunks = x.view(2 * n, seq // (2 * n))
        expected = torch.cat([chunks[r], chunks[2 * n - 1 - r]])
        assert torch.equal(local_positions(seq, n, r), expected)
    assert torch.equal(torch.sort(torch.cat([local_positions(seq, 4, r) for r in range(4)])).values, x)


@pytest.mark.parametrize("impl", ["naive", "chunked"])
@pytest.mark.parametrize("n", [2, 4])
def test_copy_lse_with_global_query_positions_equals_the_full_sequence(impl, n):
    """Each CP rank's queries against the whole sequence's keys give the full run's rows; the key gradients
    summed over ranks (what the reduce-scatter does) give the full run's key gradient."""
    g = torch.Generator().manual_seed(0)
    b, H, T, d = 2, 2, 32, 8
    q = torch.randn(b, H, T, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, H, T, d, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 5, (b, T), generator=g)
    labels[0, 3] = -1  # never a candidate
    doc = torch.zeros(b, T, dtype=torch.long)
    doc[:, 11:] = 1
    doc[1, 23:] = 2
    w_all, w_match = torch.randn(b, H, T, generator=g, dtype=torch.float64), torch.randn(b, H, T, generator=g,
                                                                                          dtype=torch.float64)

    def weighted(a, m, rows=slice(None)):  # a loss whose gradient touches every finite entry
        fa, fm = torch.isfinite(a), torch.isfinite(m)
        return (torch.where(fa, a, 0.0) * w_all[:, :, rows]).sum() + (torch.where(fm, m, 0.0) * w_match[:, :, rows]).sum()

    full_all, full_match = cplm_kernels.copy_lse_naive(q, k, labels, doc)
    dq_full, dk_full = torch.autograd.grad(weighted(full_all, full_match), (q, k))
    dk_sum = torch.zeros_like(k)
    for r in range(n):
        pos = local_positions(T, n, r)
        qr = q.detach()[:, :, pos].requires_grad_(True)
        kr = k.detach().clone().requires_grad_(True)
        if impl == "naive":
            a, m = cplm_kernels.copy_lse_naive(qr, kr, labels, doc, q_positions=pos)
        else:  # block 3 straddles the rank's two chunks: still exact
            a, m = cplm_kernels.copy_lse_chunked(qr, kr, labels, doc, block=3, q_positions=pos)
        # exact up to fp64 summation order
        torch.testing.assert_close(a, full_all[:, :, pos], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m, full_match[:, :, pos], rtol=1e-12, atol=1e-12)
        dq, dk = torch.autograd.grad(weighted(a, m, pos), (qr, kr))
        torch.testing.assert_close(dq, dq_full[:, :, pos], rtol=1e-10, atol=1e-12)
        dk_sum += dk
    torch.testing.assert_close(dk_sum, dk_full, rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def cp2():
    """Both ranks of one CP=2 process group (tests/parallel/cp_workers.py::cp2_cases)."""
    from tests.dist_utils import run_distributed
    from tests.parallel.cp_workers import cp2_cases

    return run_distributed(cp2_cases, 2)


@pytest.mark.slow
@pytest.mark.parametrize("mixing", ["gate", "sentinel"])
def test_copy_head_at_cp2_equals_cp1(cp2, mixing):
    """Per-token losses and the gradients of the head's inputs (hidden states, LM cross entropies) at CP=2 are
    CP=1's rows; the parameter gradients summed over the CP ranks (what DDP's dp-cp all-reduce does) are CP=1's.
    No backbone involved: it holds whatever core attention produced the hidden states."""
    from tests.parallel.cp_workers import head_inputs, head_run

    full = head_run(mixing, head_inputs())  # CP=1, in this process (no parallel state)
    assert cp2[0]["dp"] == 1
    for rank in cp2:
        pos, got = rank["positions"], rank["head"][mixing]
        # fp64 throughout: the only differences are summation orders (~1e-15 relative)
        for key in ("loss", "gate", "d_hidden", "d_lm_ce"):
            torch.testing.assert_close(got[key], full[key][:, pos], rtol=1e-10, atol=1e-12, msg=key)
    for name in [n for n in full if n not in ("loss", "gate", "d_hidden", "d_lm_ce")]:
        torch.testing.assert_close(cp2[0]["head"][mixing][name] + cp2[1]["head"][mixing][name], full[name],
                                   rtol=1e-10, atol=1e-12, msg=name)


# fp32 fused head (kernels within FP32_TOL = 1e-5 of exact, tests/kernels/test_fused_copy.py), 32-term
# projections and the mixture in fp32: tests/kernels/test_sentinel_mixture.py's FUSED_TOL (relative to the largest
# entry); CP=2 vs CP=1 differ only in summation orders (the reduce-scattered key gradients), well inside it
FUSED_TOL = 5e-5


@pytest.mark.slow
@pytest.mark.parametrize("fp8", [False, True], ids=["fp32", "fp8"])
@pytest.mark.parametrize("mixing", ["gate", "sentinel"])
def test_fused_copy_head_at_cp2_equals_cp1(cp2, mixing, fp8):
    """copy_head.impl=fused (Triton interpreter) at CP=2: per-token losses and the gradients of the head's inputs
    are the CP=1 fused run's rows, parameter gradients summed over ranks are CP=1's; without FP8 both also match
    the fp64 chunked head (an independent path). FP8: every rank quantizes q with the CP group's amax."""
    from tests.kernels.copy_cases import rel_err
    from tests.parallel.cp_workers import FUSED_HEAD, head_inputs, head_run

    full = head_run(mixing, head_inputs(), impl="fused", fp8=fp8, head=FUSED_HEAD)
    exact = None if fp8 else head_run(mixing, head_inputs(), head=FUSED_HEAD)
    rows = ("loss", "gate", "d_hidden", "d_lm_ce")
    got = {key: torch.empty_like(full[key]) for key in rows}
    for rank in cp2:
        for key in rows:
            got[key][:, rank["positions"]] = rank["fused"][(mixing, fp8)][key]
    for name in [n for n in full if n not in rows]:
        got[name] = cp2[0]["fused"][(mixing, fp8)][name] + cp2[1]["fused"][(mixing, fp8)][name]
    assert set(got) == set(full) and len(got) > len(rows)
    for name in full:
        assert rel_err(got[name], full[name]) <= FUSED_TOL, name
        if exact is not None:
            assert rel_err(got[name].double(), exact[name]) <= FUSED_TOL, name


@pytest.mark.slow
@pytest.mark.parametrize("case", ["causal", "documents"])
def test_sdpa_attention_at_cp2_equals_the_full_sequence(cp2, case):
    """SDPAttention at CP=2: outputs and q/k/v gradients are the full-sequence SDPA's rows of this rank (k/v
    gradients reduce-scattered back from the other rank's queries)."""
    for rank in cp2:
        r = rank["attention"][case]
        # fp32, sequences of 32: summation order differences ~1e-6
        torch.testing.assert_close(r["got"], r["ref"], rtol=1e-5, atol=1e-5)
        for key in ("dq", "dk", "dv"):
            torch.testing.assert_close(*r[key], rtol=1e-5, atol=1e-5, msg=key)
        assert r["mask_shape"] in (None, (2, 1, 16, 32))  # query rows local, key columns global
        assert r["same_rows"]  # the step's local rows = megatron's get_batch_on_this_cp_rank of the full mask


CP_ITERS = 6


def _train(corpus, run_dir, nproc: int, cp: int, masking: str, **extra):
    """The tiny recipe for CP_ITERS iterations (schedule included) at parallel.cp=cp on nproc processes."""
    from tests.training import pretrain_utils as pu

    return pu.run(nproc, pu.tiny_overrides(corpus, run_dir, CP_ITERS, **{
        "parallel.cp": cp, "data.document_masking": masking, "checkpoint.interval": 0, **extra}))


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_streaming")
def test_tiny_recipe_at_cp2_trains_like_cp1_and_resumes_across_cp_layouts(stdlib_corpus, tmp_path):
    """Document masking on: CP=2 (iterations 1-2) -> checkpoint -> CP=1 (3-4) -> checkpoint -> CP=2 (5-6) gives
    the per-iteration losses of one uninterrupted CP=1 run (CP peers read the same micro-batches and split them;
    checkpoints are layout-free). The last checkpoint (saved at CP=2) scores and exports to its CP=2 forward's
    validation loss, and scores like the CP=1 run's last checkpoint."""
    from tests.training import pretrain_utils as pu

    ref = _train(stdlib_corpus, tmp_path / "ref", 1, 1, "true")
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    reference = pu.losses(tmp_path / "ref")
    assert sorted(reference) == list(range(1, CP_ITERS + 1))
    run_dir = tmp_path / "chain"
    for nproc, cp, stop in ((2, 2, 2), (1, 1, 4)):  # exit_after_iters counts the iterations of one launch
        proc = _train(stdlib_corpus, run_dir, nproc, cp, "true", **{"train.exit_after_iters": 2})
        assert pu.stopped_for_resume(proc.returncode, proc.stderr), proc.stdout[-3000:] + proc.stderr[-3000:]
        pu.assert_losses_match(run_dir, reference, range(stop - 1, stop + 1))
        assert f"[train] layout tp=1 pp=1 dp=1 cp={cp} " in proc.stdout
        saved = json.loads((run_dir / "checkpoints" / f"iter_{stop:07d}" / "cplm_state.json").read_text())
        assert saved["layout"] == {"tp": 1, "pp": 1, "cp": cp, "dp": 1}
        if cp == 1:  # a CP-only change is a new layout: the RNG states of CP=2's ranks are not restored at CP=1
            assert ("at iteration 2 (new layout); saved at tp=1 pp=1 dp=1 cp=2, running at tp=1 pp=1 dp=1 cp=1: "
                    "RNG states start fresh") in proc.stdout, proc.stdout[-3000:]
    last = _train(stdlib_corpus, run_dir, 2, 2, "true")
    assert last.returncode == 0 and "resumed from" in last.stdout, last.stdout[-3000:] + last.stderr[-3000:]
    assert "at iteration 4 (new layout); saved at tp=1 pp=1 dp=1 cp=1, running at tp=1 pp=1 dp=1 cp=2" in last.stdout
    pu.assert_losses_match(run_dir, reference, range(1, CP_ITERS + 1))
    # the last launch's checkpoint (saved at CP=2) for scoring and export: the same run, no extra training
    _assert_cp2_checkpoint_scores_and_exports_like_its_cp2_forward(run_dir / "checkpoints" / f"iter_{CP_ITERS:07d}",
                                                                   stdlib_corpus, tmp_path)
    # and like the uninterrupted CP=1 run's checkpoint (not bitwise: other summation orders over 6 steps)
    _assert_scores_like(tmp_path / "ref" / "checkpoints" / f"iter_{CP_ITERS:07d}", tmp_path / "m.json",
                        stdlib_corpus, tmp_path)


# val samples scored: 2 batches of 4 x 256 tokens (the corpus's seq_len), ~2000 tokens of the mixture's NLL
VAL_BATCH, VAL_LIMIT = 4, 8
# CP=2 vs CP=1 Megatron (fp32): the same weights and tokens; only the summation orders of attention and of the copy
# scores over the gathered keys differ, ~1e-6 relative per token (test_sdpa_attention_at_cp2_equals_the_full_sequence
# holds 1e-5 on sequences of 32), and the loss is a mean over ~2000 tokens -> 1e-5 relative. HF vs Megatron:
# test_scorers.py's BACKEND_ATOL (1e-4 on log-probs of |log p| <~ 10) -> metrics within 1e-4 relative, as
# tests/evaluation/test_scorers.py compares them.
CP_SCORE_REL, HF_SCORE_REL = 1e-5, 1e-4


def _val_args(corpus) -> tuple:
    return ("--tasks", "val", "--data", str(corpus.val_dir), "--batch-size", str(VAL_BATCH), "--limit", str(VAL_LIMIT),
            "--no-progress")


def _assert_scores_like(checkpoint, scored_json, corpus, tmp_path):
    """tools/evaluate.py on `checkpoint` gives the val loss recorded in `scored_json` within the training tests'
    layout tolerance (tests/training/pretrain_utils.py: assert_losses_match, 1e-4 relative)."""
    from tests import harness

    proc = harness.run_tool_warm("evaluate", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "ref.json"),
                                 *_val_args(corpus))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads((tmp_path / "ref.json").read_text())["tasks"]["val"]["metrics"]["val_loss"]
    assert got == pytest.approx(json.loads(scored_json.read_text())["tasks"]["val"]["metrics"]["val_loss"], rel=1e-4)


def _assert_cp2_checkpoint_scores_and_exports_like_its_cp2_forward(checkpoint, corpus, tmp_path):
    """A checkpoint saved at CP=2: tools/evaluate.py (which scores at CP=1 and says so) and the HF export of it
    (tools/convert_to_hf.py, then tools/evaluate.py --hf) give the validation loss of the model's own CP=2 forward
    (2 gloo processes, the trainer's model and batch split) over the same samples."""
    from tests import harness
    from tests.parallel.cp_workers import checkpoint_val_nll

    assert json.loads((checkpoint / "cplm_state.json").read_text())["layout"]["cp"] == 2
    ranks = harness.run_distributed(checkpoint_val_nll, 2, str(checkpoint), str(corpus.val_dir), VAL_BATCH, VAL_LIMIT)
    assert ranks[0]["tokens"] * 2 == corpus.val.seq_len  # each rank held half of every sequence
    cp2_loss = sum(r["nll"] for r in ranks) / sum(r["count"] for r in ranks)
    common = _val_args(corpus)
    scored = harness.run_tool_warm("evaluate", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "m.json"),
                                   *common)
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    assert "trained at parallel.cp=2, scored at cp=1" in scored.stderr, scored.stderr[-3000:]
    exported = harness.run_tool_warm("convert_to_hf", "--checkpoint", str(checkpoint), "--output",
                                     str(tmp_path / "hf"), "--tokenizer", str(corpus.tokenizer_dir))
    assert exported.returncode == 0, exported.stdout[-3000:] + exported.stderr[-3000:]
    hf = harness.run_tool_warm("evaluate", "--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "hf.json"),
                               *common)
    assert hf.returncode == 0, hf.stdout[-3000:] + hf.stderr[-3000:]
    megatron_val = json.loads((tmp_path / "m.json").read_text())["tasks"]["val"]
    hf_val = json.loads((tmp_path / "hf.json").read_text())["tasks"]["val"]
    assert megatron_val["details"]["tokens"] == sum(r["count"] for r in ranks)
    assert megatron_val["metrics"]["val_loss"] == pytest.approx(cp2_loss, rel=CP_SCORE_REL)
    for metric, value in megatron_val["metrics"].items():  # every val metric of the export = the checkpoint's
        assert hf_val["metrics"][metric] == pytest.approx(value, rel=HF_SCORE_REL), metric


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_streaming")
def test_tiny_recipe_at_cp2_and_tp2_cp2_train_like_cp1_causal(stdlib_corpus, tmp_path):
    """Document masking off (plain causal attention over the packed rows; the copy head still per document):
    CP=2 on 2 processes and TP=2 x CP=2 on 4 give the losses of CP=1 on one."""
    from tests.training import pretrain_utils as pu

    runs = {}
    for name, nproc, cp, extra in (("cp1", 1, 1, {}), ("cp2", 2, 2, {}), ("tp2cp2", 4, 2, {"parallel.tp": 2})):
        proc = _train(stdlib_corpus, tmp_path / name, nproc, cp, "false", **{"train.iters": 3, **extra})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = pu.losses(tmp_path / name)
    assert sorted(runs["cp1"]) == [1, 2, 3]
    for name in ("cp2", "tp2cp2"):
        pu.assert_losses_match(tmp_path / name, runs["cp1"], [1, 2, 3])


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_streaming")
def test_tiny_recipe_tp2_cp2_with_document_masking_and_sp_train_like_cp1(stdlib_corpus, tmp_path):
    """Document masking on: TP=2 x CP=2 on 4 processes, without and with sequence parallelism, gives the losses of
    TP=1 x CP=1 on one (the local query rows of the dense document mask, SP's scatter of each CP rank's tokens).
    PP x CP is refused (test_context_parallel_layout_errors_name_the_fix)."""
    from tests.training import pretrain_utils as pu

    runs = {}
    for name, nproc, cp, extra in (("cp1", 1, 1, {}), ("tp2cp2", 4, 2, {"parallel.tp": 2}),
                                   ("tp2cp2sp", 4, 2, {"parallel.tp": 2, "parallel.sp": "true"})):
        proc = _train(stdlib_corpus, tmp_path / name, nproc, cp, "true", **{"train.iters": 2, **extra})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"[train] layout tp={extra.get('parallel.tp', 1)} pp=1 dp=1 cp={cp} " in proc.stdout
        runs[name] = pu.losses(tmp_path / name)
    assert sorted(runs["cp1"]) == [1, 2]
    for name in ("tp2cp2", "tp2cp2sp"):
        pu.assert_losses_match(tmp_path / name, runs["cp1"], [1, 2])


@pytest.mark.parametrize("overrides, world, message", [
    (["train.seq_len=250"], None, r"train\.seq_len=250 is not divisible by 2 x parallel\.cp = 4"),
    (["model.attention_impl=megatron"], None, r"parallel\.cp=2 needs model\.attention_impl=sdpa"),
    (["parallel.pp=2"], None, r"parallel\.cp=2 with parallel\.pp=2 is refused: .* use parallel\.tp/cp/dp with pp=1"),
    ([], 3, r"world size 3 is not divisible by parallel\.tp\*parallel\.pp\*parallel\.cp = 1\*1\*2 = 2"),
    (["parallel.tp=2"], 2, r"world size 2 is not divisible by parallel\.tp\*parallel\.pp\*parallel\.cp = 2\*1\*2"),
], ids=["seq-len", "attention", "pp-x-cp", "world", "tp-x-cp"])
def test_context_parallel_layout_errors_name_the_fix(overrides, world, message):
    """Checked when the recipe is loaded or against the world size: before any process group."""
    from cplm_megatron.errors import ConfigError
    from cplm_megatron.run_config import load_run_config
    from tests.training.pretrain_utils import REPO

    with pytest.raises(ConfigError, match=message):
        cfg = load_run_config(str(REPO / "configs/tiny.yaml"), ["parallel.cp=2", *overrides])
        cfg.validate_world(world)


def test_fused_copy_kernel_and_fp8_are_allowed_under_context_parallelism():
    """The fused kernel takes global query positions (tests/kernels/test_fused_copy_cp.py): no refusal."""
    from cplm_megatron.run_config import load_run_config
    from tests.training.pretrain_utils import REPO

    cfg = load_run_config(str(REPO / "configs/tiny.yaml"), ["parallel.cp=2", "copy_head.impl=fused",
                                                             "copy_head.head_dim=32", "copy_head.fp8=true",
                                                             "precision.dtype=bf16"])
    assert cfg.validate_world(2) == 1


def test_context_parallel_layout_gives_the_data_parallel_size():
    from cplm_megatron.run_config import load_run_config
    from tests.training.pretrain_utils import REPO

    cfg = load_run_config(str(REPO / "configs/tiny.yaml"), ["parallel.cp=2", "parallel.tp=2", "train.micro_batch=2"])
    assert cfg.validate_world(8) == 2  # 8 = cp 2 x tp 2 x dp 2
