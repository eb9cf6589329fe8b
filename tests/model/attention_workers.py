"""Worker for tests/model/test_attention.py: SDPA core attention vs megatron-core's unfused DotProductAttention,
every case of one world size in one process group."""
from __future__ import annotations

from typing import Dict

import torch

from cplm_megatron.model.builder import PrecisionConfig, RecomputeConfig
from cplm_megatron.model.config import load_preset
from cplm_megatron.parallel.distributed import ParallelConfig

B, S = 2, 48


def _batch(vocab: int):
    """Tokens, labels, per-document positions and document ids (three documents in row 0, two in row 1)."""
    g = torch.Generator().manual_seed(5)
    toks = torch.randint(0, vocab, (B, S + 1), generator=g)
    doc = torch.zeros(B, S, dtype=torch.long)
    doc[0, 10:], doc[0, 30:], doc[1, 25:] = 1, 2, 1
    starts = torch.stack([torch.searchsorted(doc[b], doc[b], right=False) for b in range(B)])
    pos = torch.arange(S)[None] - starts
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous(), pos, doc


def _core_pair(config, dropout: float = 0.0):
    """SDPAttention and megatron's DotProductAttention (as the builder uses it: taking document ids too) for one
    layer of ``config`` (no weights: attention has none)."""
    from megatron.core.transformer.enums import AttnMaskType

    from cplm_megatron.model.attention import DocumentMaskedDotProductAttention, SDPAttention

    kw = dict(layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self", attention_dropout=dropout)
    return SDPAttention(config, **kw), DocumentMaskedDotProductAttention(config, **kw)


def _core_cases(config, tp: int) -> Dict:
    """Core attention alone on random local q/k/v: forward and q/k/v gradients, fp32/bf16, causal and with
    document masking: megatron's dense boolean mask to both (masking True), and the step's document ids to SDPA
    (its per-document attention, "documents") against megatron with the dense mask."""
    from cplm_megatron.model.document_mask import dense_document_mask, document_ids_mask

    _, _, _, doc = _batch(16)
    heads, groups, d = config.num_attention_heads // tp, config.num_query_groups // tp, config.kv_channels
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(9)
        q = torch.randn(S, B, heads, d, generator=g) * 2  # scores ~ N(0, 4): softmaxes far from uniform
        k = torch.randn(S, B, groups, d, generator=g) * 2
        v = torch.randn(S, B, groups, d, generator=g)
        dout = torch.randn(S, B, heads * d, generator=g)
        sdpa, megatron = _core_pair(config)
        for masking in (False, True, "documents"):
            dense = dense_document_mask(document_ids_mask(doc)) if masking else None
            res = []
            for mod in (sdpa, megatron):
                # megatron's unfused path takes 16-bit inputs only with config.bf16 (its softmax casts); our
                # config is fp32, so the bf16 case feeds bf16 tensors to SDPA and fp32-rounded-from-bf16 to megatron
                ins = [t.to(dtype).requires_grad_() for t in (q, k, v)]
                feed = ins if mod is sdpa else [t.float() for t in ins]
                o = mod(*feed, document_ids_mask(doc) if masking == "documents" and mod is sdpa else dense)
                (o.float() * dout).sum().backward()
                res.append({"out": o.detach().float(), "grads": [t.grad.float() for t in ins]})
            out[(str(dtype), masking)] = res
    # dropout: applied in training mode only, drawn from the TP RNG tracker (without SP) or the default generator
    # (with SP, as DotProductAttention does): reproducible when both are re-seeded
    from cplm_megatron.parallel.distributed import set_seed

    drop, _ = _core_pair(config, dropout=0.3)
    q, k, v = (torch.randn(S, B, n, d) for n in (heads, groups, groups))
    set_seed(3)
    a = drop(q, k, v, None)
    set_seed(3)
    b = drop(q, k, v, None)
    drop.eval()
    c = drop(q, k, v, None)
    out["dropout"] = {"repeatable": torch.equal(a, b), "differs_from_eval": bool((a - c).abs().max() > 1e-3)}
    return out


def _model_case(parallel: ParallelConfig, impl: str, masking: bool, precision=None, recompute=None) -> Dict:
    """Per-token losses and every parameter's gradient of the tiny backbone with core attention ``impl``."""
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.document_mask import document_ids_mask
    from cplm_megatron.parallel.distributed import set_seed

    cfg = load_preset("tiny", attention_impl=impl)
    set_seed(7)  # the same weights for every case
    model = build_run(model_run(cfg, None, parallel, precision, recompute, seq_len=S)).model
    x, y, pos, doc = _batch(cfg.vocab_size)
    mask = document_ids_mask(doc) if masking else None  # what the step passes
    loss = model(x, pos if masking else torch.arange(S)[None].expand(B, S), mask, labels=y)
    loss.float().sum().backward()
    grads = {n: (p.main_grad if getattr(p, "main_grad", None) is not None else p.grad).detach().float().clone()
             for n, p in model.named_parameters()}
    kinds = {type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__}
    return {"loss": loss.detach().float(), "grads": grads, "kinds": kinds}


def compare(rank: int, tp: int) -> Dict:
    """All cases for one world size (= tp): core attention alone, then whole models (TP, SP at tp>1, GQA 4/2)."""
    from cplm_megatron.model.builder import transformer_config
    from cplm_megatron.model.layout import init_distributed

    parallel = ParallelConfig(tp=tp, sp=tp > 1)
    cfg = load_preset("tiny")
    init_distributed(parallel, cfg, seed=7)
    out: Dict = {"core": _core_cases(transformer_config(cfg, parallel), tp), "model": {}}
    for masking in (False, True):
        for impl in ("sdpa", "megatron"):
            out["model"][(impl, masking)] = _model_case(parallel, impl, masking)
    if tp == 1:  # recompute and bf16 once (layout-independent code paths)
        out["model"][("sdpa_selective", True)] = _model_case(parallel, "sdpa", True,
                                                             recompute=RecomputeConfig("selective"))
        out["model"][("sdpa_full", True)] = _model_case(parallel, "sdpa", True, recompute=RecomputeConfig("full"))
        bf16 = PrecisionConfig(dtype="bf16")
        for impl in ("sdpa", "megatron"):
            out["model"][(f"{impl}_bf16", True)] = _model_case(parallel, impl, True, precision=bf16)
        out["saved"] = _saved_bytes(cfg, parallel)
    return out


def _saved_bytes(cfg, parallel: ParallelConfig) -> Dict:
    """Bytes that one layer's core attention keeps for its backward (autograd's saved tensors, by storage), in
    bf16 training, SDPA vs megatron's unfused attention, with and without the document mask; q/k/v excluded."""
    from cplm_megatron.model.builder import transformer_config
    from cplm_megatron.model.document_mask import document_ids_mask

    config = transformer_config(cfg, parallel, PrecisionConfig(dtype="bf16"))
    heads, groups, d = cfg.num_attention_heads, cfg.kv_heads, cfg.head_dim
    _, _, _, doc = _batch(16)
    out = {}
    for masking in (False, True):
        for mod, name in zip(_core_pair(config), ("sdpa", "megatron")):
            # what each gets from the step (document ids), megatron's dense mask built from them inside its forward
            mask = document_ids_mask(doc) if masking else None
            q, k, v = (torch.randn(S, B, n, d, dtype=torch.bfloat16, requires_grad=True) for n in (heads, groups, groups))
            inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
            storages: Dict[int, tuple] = {}

            def pack(t, storages=storages, inputs=inputs):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in inputs:
                    storages[ptr] = (t.untyped_storage().nbytes(), tuple(t.shape), str(t.dtype))
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                mod(q, k, v, mask)
            out[(name, masking)] = list(storages.values())
    return out
