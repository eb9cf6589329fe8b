"""Worker for tests/parallel/test_context_parallel.py: the copy head and SDPA core attention at CP=2 in one
process group (every case of this world size), each rank's inputs its two chunks of the global ones."""
from __future__ import annotations

from typing import Dict

import torch

from cplm_megatron.model.copy_head import CopyHeadConfig, CopyPasteHead
from cplm_megatron.parallel.context import local_positions

B, T, HIDDEN = 2, 32, 24
HEAD = dict(heads=2, head_dim=8, impl="chunked", block_size=8, lm_loss_weight=1.0)
FUSED_HEAD = dict(HEAD, head_dim=32)  # a head width of the fused kernel
FUSED_CASES = [(mixing, fp8) for mixing in ("gate", "sentinel") for fp8 in (False, True)]


def head_inputs(seed: int = 0) -> Dict[str, torch.Tensor]:
    """Global (CP=1) inputs of the copy head: fp64 hidden states and LM cross entropies, labels with repeats,
    a masked stretch and three documents."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 6, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 5:9] = 0
    doc = torch.zeros(B, T, dtype=torch.long)
    doc[0, 13:], doc[1, 20:] = 1, 1
    doc[0, 27:] = 2
    return dict(hidden=torch.randn(B, T, HIDDEN, generator=g, dtype=torch.float64),
                lm_ce=torch.rand(B, T, generator=g, dtype=torch.float64) * 3, labels=labels, mask=mask, doc=doc)


def head_run(mixing: str, inputs: Dict[str, torch.Tensor], positions=None, impl: str = "chunked",
             fp8: bool = False, head: Dict = HEAD) -> Dict[str, torch.Tensor]:
    """The head's per-token losses and the gradients of its inputs and parameters for sum(loss * mask)
    over the tokens at `positions` (all at CP=1). fp64, or fp32 for the fused kernel (same initial weights)."""
    torch.manual_seed(11)
    module = CopyPasteHead(HIDDEN, CopyHeadConfig(mixing=mixing, **dict(head, impl=impl, fp8=fp8)),
                           params_dtype=torch.float64)
    dtype = torch.float32 if impl == "fused" else torch.float64
    module = module.to(dtype)
    sel = slice(None) if positions is None else positions
    hidden = inputs["hidden"][:, sel].to(dtype).clone().requires_grad_(True)
    lm_ce = inputs["lm_ce"][:, sel].to(dtype).clone().requires_grad_(True)
    mask = inputs["mask"][:, sel].to(dtype)
    out = module(hidden, lm_ce, inputs["labels"][:, sel], mask, inputs["doc"][:, sel])
    (out.loss * mask).sum().backward()
    params = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return dict(loss=out.loss.detach(), gate=out.gate.detach(), d_hidden=hidden.grad, d_lm_ce=lm_ce.grad, **params)


def _attention_cases(rank: int) -> Dict:
    """SDPAttention at CP=2 (local queries, gathered k/v) on this rank's rows of global q/k/v, causal and
    with a document mask; its outputs and q/k/v gradients, and the full-sequence SDPA reference's rows."""
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnMaskType

    from cplm_megatron.model.attention import SDPAttention
    from cplm_megatron.model.builder import transformer_config
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.document_mask import dense_document_mask, document_ids_mask
    from cplm_megatron.parallel.context import split_batch
    from cplm_megatron.parallel.distributed import ParallelConfig

    model = load_preset("tiny")
    config = transformer_config(model, ParallelConfig(cp=2))
    core = SDPAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    heads, groups, d = model.num_attention_heads, model.kv_heads, model.head_dim
    g = torch.Generator().manual_seed(3)
    q = torch.randn(T, B, heads, d, generator=g)
    k, v = torch.randn(T, B, groups, d, generator=g), torch.randn(T, B, groups, d, generator=g)
    w = torch.randn(T, B, heads * d, generator=g)
    doc = head_inputs()["doc"]
    pos = local_positions(T, 2, rank)
    out = {}
    for name, global_mask in (("causal", None), ("documents", dense_document_mask(document_ids_mask(doc)))):
        # reference: plain SDPA over the whole sequence, gradients of sum(out * w)
        qf, kf, vf = (t.clone().requires_grad_(True) for t in (q, k, v))
        rep = heads // groups
        args = [t.permute(1, 2, 0, 3) for t in (qf, kf.repeat_interleave(rep, 2), vf.repeat_interleave(rep, 2))]
        ref = F.scaled_dot_product_attention(*args, attn_mask=None if global_mask is None else ~global_mask,
                                             is_causal=global_mask is None)
        ref = ref.permute(2, 0, 1, 3).reshape(T, B, heads * d)
        (ref * w).sum().backward()
        ql, kl, vl = (t[pos].clone().requires_grad_(True) for t in (q, k, v))
        # the step passes the whole sequence's document ids; the rows SDPA builds for this rank's queries are
        # Megatron's split of the full dense mask
        ids = None if global_mask is None else document_ids_mask(doc)
        local_mask = None if ids is None else dense_document_mask(ids, pos)
        same_rows = global_mask is None or torch.equal(
            local_mask, split_batch({"attention_mask": global_mask})["attention_mask"])
        got = core(ql, kl, vl, ids)
        (got * w[pos]).sum().backward()
        out[name] = dict(got=got.detach(), ref=ref.detach()[pos], dq=(ql.grad, qf.grad[pos]),
                         dk=(kl.grad, kf.grad[pos]), dv=(vl.grad, vf.grad[pos]), mask_shape=tuple(local_mask.shape)
                         if local_mask is not None else None, same_rows=same_rows)
    return out


def cp2_cases(rank: int) -> Dict:
    """Every CP=2 case in one process group: the copy head (gate and sentinel mixing; chunked, and fused with and
    without FP8 in the Triton interpreter) and SDPA attention."""
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig

    layout = init_distributed(ParallelConfig(cp=2, backend="gloo"), load_preset("tiny"))
    pos = local_positions(T, 2, rank)
    inputs = head_inputs()
    head = {mixing: head_run(mixing, inputs, pos) for mixing in ("gate", "sentinel")}
    fused = {case: head_run(case[0], inputs, pos, "fused", case[1], FUSED_HEAD) for case in FUSED_CASES}
    return dict(positions=pos, dp=layout.dp, head=head, fused=fused, attention=_attention_cases(rank))


def checkpoint_val_nll(rank: int, checkpoint: str, data: str, batch_size: int, limit: int) -> Dict:
    """A checkpoint at CP=2 as the trainer runs it (its saved config, `build_run`, `model_inputs`' split):
    this rank's summed mixture NLL and token count over the batches the val task scores (fp64 sums)."""
    from dataclasses import replace
    from pathlib import Path

    from cplm_megatron.checkpoint.weights import load_weights
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.scorers import saved_run_config
    from cplm_megatron.evaluation.tasks.val import open_val_loader, val_batches
    from cplm_megatron.model.builder import build_run
    from cplm_megatron.model.inputs import model_inputs
    from cplm_megatron.model.layout import init_distributed

    cfg = saved_run_config(Path(checkpoint))
    cfg = replace(cfg, parallel=replace(cfg.parallel, cp=2, backend="gloo"))
    layout = init_distributed(cfg.parallel, cfg.model, cfg.run.seed)
    model = build_run(cfg, layout).model
    load_weights([model], checkpoint)
    model.eval()
    masking = bool(cfg.data.document_masking)
    loader = open_val_loader([data], batch_size, masking, cfg.model.vocab_size)
    nll = count = 0.0
    with torch.no_grad():
        for batch in val_batches(loader, EvalOptions(batch_size=batch_size, limit=limit)):
            inputs = model_inputs(batch, torch.device("cpu"), masking)
            _, copy_out = model(**inputs, output="loss_and_copy")
            mask = inputs["loss_mask"].double()
            nll += float((copy_out.metrics()["mix_loss"].double() * mask).sum())
            count += float(mask.sum())
    return dict(nll=nll, count=count, tokens=int(inputs["input_ids"].shape[1]))
