"""The GPU study's throughput estimate: seconds per token = layers x a + training FLOPs per token / R, fitted to two
runs measured on one H200, gives the arms' tokens/s and the candidate shapes the study's was chosen from."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from cplm_megatron.experiments.gpu_study.sizes import ARMS, Sizes, study_model

# The throughput model behind the shape (seconds per token = layers x a + training FLOPs per token / R), fitted to two
# runs measured on one H200 on 2026-12-04 (results/gpu/2026-12-04, bf16, SDPA, Megatron's LM-head loss):
# SmolLM2-135M at seq 2048, micro-batch 8: 128.5k tokens/s; SmolLM2-1.7B at seq 4096, 16 sequences per step: 37.4k.
MEASURED = (("smollm2-135m", 2048, 128_500.0), ("smollm2-1.7b", 4096, 37_400.0))
# Shapes the study's was chosen from ((layers, width), FFN 3 x width, 64-wide heads, 2 KV groups), each estimated in
# an arm's share of the lease's 200 s study (LEASE_SHARE_S: 190 s for the step, less ~30 s for the 60 MB corpus on
# the machine's cores, less the 45 s scoring reserve, in two)
CANDIDATES = ((2, 256), (4, 256), (4, 384), (6, 256), (8, 512))
LEASE_SHARE_S = 60


def throughput_fit() -> tuple[float, float]:
    """(a, R) of seconds per token = layers x a + training FLOPs per token / R, solved from the two MEASURED runs."""
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.sizing.accounting import train_flops_per_token

    rows = []
    for preset, seq, tokens_per_sec in MEASURED:
        model = replace(load_preset(preset), max_position_embeddings=max(seq, 2048))
        rows.append((model.num_layers, train_flops_per_token(model, seq, None), 1 / tokens_per_sec))
    (l1, f1, t1), (l2, f2, t2) = rows
    inverse_rate = (t2 - t1 * l2 / l1) / (f2 - f1 * l2 / l1)
    return (t1 - f1 * inverse_rate) / l1, 1 / inverse_rate


def estimated_tokens_per_sec(model: Any, copy: Any, seq_len: int) -> float:
    """The H200 tokens/s of a model by the fit (`throughput_fit`): an estimate, to be measured."""
    from cplm_megatron.model.sizing.accounting import train_flops_per_token

    a, rate = throughput_fit()
    return 1 / (model.num_layers * a + train_flops_per_token(model, seq_len, copy) / rate)


def candidate_model(sizes: Sizes, vocab: int, layers: int, width: int) -> Any:
    """A candidate shape as a ModelConfig (the study's model with `layers` x `width`)."""
    shape = {"num_layers": layers, "hidden_size": width, "ffn_hidden_size": 3 * width,
             "num_attention_heads": width // 64, "num_query_groups": 2}
    return study_model(replace(sizes, model=shape), vocab, sizes.seq_len)


def estimate(sizes: Sizes, vocab: int) -> dict[str, Any]:
    """The arms' estimated H200 tokens/s, the tokens that gives in the longest arm share, and the candidate shapes'
    baseline tokens/s and tokens in an arm's share of the lease's study."""
    from cplm_megatron.model.sizing.accounting import CopyHeadShape, train_flops_per_token

    model = study_model(sizes, vocab, sizes.seq_len)
    rates = {arm: estimated_tokens_per_sec(model, CopyHeadShape() if arm == "cplm" else None, sizes.seq_len)
             for arm in ARMS}
    a, rate = throughput_fit()
    candidates = []
    for layers, width in CANDIDATES:
        shape = candidate_model(sizes, vocab, layers, width)
        speed = estimated_tokens_per_sec(shape, None, sizes.seq_len)
        candidates.append({"layers": layers, "width": width, "study": (layers, width) == (
            sizes.model["num_layers"], sizes.model["hidden_size"]),
            "train_mflop_per_token": round(train_flops_per_token(shape, sizes.seq_len, None) / 1e6, 1),
            "tokens_per_sec_h200": round(speed), "tokens_in_lease_share": round(speed * LEASE_SHARE_S)})
    return {"model": sizes.model, "vocab_size": vocab, "seq_len": sizes.seq_len,
            "tokens_per_sec_h200": {arm: round(r) for arm, r in rates.items()},
            "tokens_in_max_arm_share": round(min(rates.values()) * sizes.max_arm_seconds),
            "lease_share_s": LEASE_SHARE_S, "candidates": candidates,
            "basis": f"seconds/token = layers x {a:.3e} + FLOPs/token / {rate:.3e} (fitted to the 2026-12-04 H200 "
                     f"runs: 135M 128.5k tokens/s, 1.7B seq 4096 37.4k); an estimate, to be measured"}
