"""How big each phase of the GPU study is: the GPU's sizes and the CPU dry run's (--tiny), the arms, the recipe and
the model both arms train."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

RECIPE = "smollm2_135m"  # the shipped recipe (configs/smollm2_135m.yaml) the arms override
ARMS = ("cplm", "baseline")  # training order: the CPLM (the slower arm) sets the tokens both train
TARGET_TOKENS = 100_000_000  # per arm: copying circuits appear after ~1e8 tokens


@dataclass(frozen=True)
class Sizes:
    """How big each phase is."""

    model: dict[str, Any]  # overrides of the tiny preset (model.*)
    corpus_bytes: int
    vocab_size: int
    seq_len: int
    tokenizer_sample_bytes: int
    micro_batch: int
    global_batch: int
    max_iters: int  # the iteration cap of an arm (its time share normally ends it first on a GPU)
    max_arm_seconds: float  # an arm's time share at most
    warmup_iters: int
    lr: float
    probe_interval: int
    probe_sequences: int
    probe_copy_length: int
    probe_val_batches: int  # validation micro-batches of the in-context score
    score_reserve_s: float  # kept for scoring (and the arms' start-up) out of the budget
    eval_batch: int
    val_sequences: int  # validation samples scored (spread across the set; dev samples the cache is tuned on)
    copy_sequences: int
    copy_length: int
    passkey_per_cell: int
    passkey_lengths: tuple
    passkey_depths: tuple = (0.0, 0.5, 1.0)
    budget_s: float = 200.0  # the step's seconds (--budget overrides)

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step."""
        return self.global_batch * self.seq_len


STUDY_MODEL = {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 768, "num_attention_heads": 4,
               "num_query_groups": 2}
GPU = Sizes(model=STUDY_MODEL, corpus_bytes=60_000_000, vocab_size=8192, seq_len=1024,
            tokenizer_sample_bytes=24_000_000, micro_batch=64, global_batch=64, max_iters=6000, max_arm_seconds=90,
            warmup_iters=30, lr=2e-3, probe_interval=100, probe_sequences=32, probe_copy_length=256,
            probe_val_batches=2, score_reserve_s=45, eval_batch=32, val_sequences=256, copy_sequences=64,
            copy_length=512, passkey_per_cell=16, passkey_lengths=(256, 1024))
TINY = Sizes(model={"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 192, "num_attention_heads": 2,
                    "num_query_groups": 1},
             corpus_bytes=4_000_000, vocab_size=512, seq_len=128, tokenizer_sample_bytes=400_000, micro_batch=4,
             global_batch=4, max_iters=5000, max_arm_seconds=25, warmup_iters=2, lr=1e-3, probe_interval=5,
             probe_sequences=4, probe_copy_length=32, probe_val_batches=1, score_reserve_s=60, eval_batch=4,
             val_sequences=16, copy_sequences=4, copy_length=64, passkey_per_cell=2, passkey_lengths=(64, 128),
             passkey_depths=(0.0, 1.0), budget_s=2000)


def study_model(sizes: Sizes, vocab: int, seq_len: int) -> Any:
    """The ModelConfig both arms train (the tiny preset with SIZES.model)."""
    from cplm_megatron.model.config import load_preset

    return replace(load_preset("tiny"), **sizes.model, vocab_size=vocab, max_position_embeddings=seq_len)

