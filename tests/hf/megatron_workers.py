"""Megatron-side workers of the conversion tests, run in spawned processes (tests/dist_utils.py).

Each worker builds the real Megatron model at a RunConfig's layout and returns what the last
pipeline stage computes (TP rank 0; other ranks return None), through Megatron's own pipeline schedule.
"""

from __future__ import annotations

import hashlib
from functools import partial

import torch

from cplm_megatron.run_config import RunConfig, load_run_config

SEQ_LEN = 32
EOD_ID = 0  # <|endoftext|> of the test tokenizer (hf_testing.BOS_EOS_ID): exports reset copy candidates at it


def _generator(name: str, stage: str) -> torch.Generator:
    """A generator seeded by a parameter name and pipeline stage/chunk (the same on every TP rank)."""
    digest = hashlib.sha256(f"{name}@{stage}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:7], "little"))


@torch.no_grad()
def randomize_constant_init(chunk: torch.nn.Module, chunk_index: int = 0) -> None:
    """Give the parameters Megatron initializes to constants (norms, biases) and the copy head random values.

    Norm weights of 1 would hide a swapped input/post-attention norm, zero biases a misplaced bias,
    and a near-uniform fresh copy head the copy path. Values are equal on all TP ranks; a TP-sharded
    bias gets its slice of one full random vector, so the full tensor does not depend on the layout.
    """
    from megatron.core import parallel_state as ps

    tp, tp_rank, pp_rank = (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
                            ps.get_pipeline_model_parallel_rank())
    for name, param in chunk.named_parameters():
        g = _generator(name, f"{pp_rank}.{chunk_index}")
        if name.startswith("copy_head."):
            if name.endswith("gate.bias"):
                param.zero_()  # gate near 0.5: the copy distribution carries half the mass
            elif name.endswith("_norm.weight"):
                param.copy_(torch.empty(param.shape).uniform_(0.5, 2.0, generator=g))
            else:
                param.copy_(torch.randn(param.shape, generator=g) * 0.2)
        elif name.endswith("norm.weight"):  # input/pre-MLP/final norms
            param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=g))
        elif name.endswith(".bias"):
            sharded = getattr(param, "tensor_model_parallel", False)
            full = 0.1 * torch.randn(param.shape[0] * (tp if sharded else 1), generator=g)
            param.copy_(full.view(tp, -1)[tp_rank] if sharded else full)


def random_batches(count: int, batch: int, vocab_size: int, seed: int) -> list[torch.Tensor]:
    """Input ids with many repeats (copy candidates match often) from the first 64 ids of the vocabulary,
    and an EOD in the middle of every row (a document boundary for the copy head)."""
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, min(64, vocab_size), (batch, SEQ_LEN), generator=g) for _ in range(count)]
    for ids in batches:
        ids[:, SEQ_LEN // 2] = EOD_ID
    return batches


def documents_at_eod(input_ids: torch.Tensor) -> torch.Tensor:
    """Document ids as the training loader derives them from packed samples: a new document after each EOD."""
    is_eod = (input_ids == EOD_ID).long()
    return torch.cumsum(is_eod, dim=1) - is_eod


def shifted_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """labels = input ids shifted left, -1 (no label, never a copy candidate) at the end."""
    return torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], -1)], dim=1)


def build(cfg: RunConfig) -> list[torch.nn.Module]:
    """Parallel state for `cfg`'s layout (re-made when it changes) + its model chunks (eval mode)."""
    from megatron.core import parallel_state as ps

    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.layout import init_distributed

    if ps.model_parallel_is_initialized() and (
        ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
        ps.get_virtual_pipeline_model_parallel_world_size(),
    ) != (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.vpp):
        ps.destroy_model_parallel()  # same processes and process group, another TP/PP layout
    layout = init_distributed(cfg.parallel, cfg.model, cfg.run.seed)
    chunks = build_run(model_run(cfg.model, cfg.copy_head, cfg.parallel, cfg.precision, seq_len=SEQ_LEN), layout).chunks
    for chunk in chunks:
        chunk.eval()
    return chunks


def _forward_step(output: str, batches, model):
    input_ids = next(batches)
    positions = torch.arange(input_ids.shape[1])[None].expand_as(input_ids)
    if output == "logits":
        out = model(input_ids, positions, None)
    elif output == "loss":  # per-token cross entropy [b, s] of the next token (the last label is arbitrary)
        labels = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
        out = model(input_ids, positions, None, labels=labels)
    else:
        out = model(input_ids, positions, None, labels=shifted_labels(input_ids), output="log_probs_gathered",
                    document_ids=documents_at_eod(input_ids))

    def keep(tensor: torch.Tensor):
        return tensor.sum() * 0.0, torch.tensor(1), {"out": tensor.detach().clone()}

    return out, keep


@torch.no_grad()
def score(chunks: list[torch.nn.Module], batches: list[torch.Tensor], output: str) -> list[torch.Tensor] | None:
    """Per batch: Megatron's mixture log-probs [b, s, V_padded] (`log_probs`), raw logits (`logits`,
    gathered over TP) or per-token loss (`loss`); on the last stage's TP rank 0, None elsewhere."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.pipeline_parallel import get_forward_backward_func

    interleaved = len(chunks) > 1  # virtual pipeline: every chunk reads the same micro-batches
    results = get_forward_backward_func()(
        forward_step_func=partial(_forward_step, output),
        data_iterator=[iter(batches) for _ in chunks] if interleaved else iter(batches),
        model=chunks if interleaved else chunks[0],
        num_microbatches=len(batches),
        seq_length=SEQ_LEN,
        micro_batch_size=batches[0].shape[0],
        forward_only=True,
    )
    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return None
    outs = [r["out"] for r in results]
    if output == "logits":  # vocab-sharded: gather the slices of all TP ranks
        outs = [tensor_parallel.gather_from_tensor_model_parallel_region(o) for o in outs]
    return outs if ps.get_tensor_model_parallel_rank() == 0 else None


def save_and_score(rank: int, variants: dict[str, dict], output_root: str) -> dict[str, dict]:
    """Per variant {name: {"overrides", "batches", "output"[, "with_optimizer"]}}: build at its layout,
    randomize, save a trainer checkpoint under output_root/name, score the batches.
    Returns {name: scores or None}."""
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.training.optimizer import (
        build_optimizer,
        build_scheduler,
        wrap_ddp,
    )

    results = {}
    for name, variant in variants.items():
        cfg = load_run_config(None, variant["overrides"])
        chunks = build(cfg)
        for index, chunk in enumerate(chunks):
            randomize_constant_init(chunk, index)
        optimizer = scheduler = None
        if variant.get("with_optimizer"):  # as the trainer saves: DDP-wrapped model + optimizer state
            t = cfg.train
            chunks = wrap_ddp(chunks, cfg.optimizer, bf16=False)
            optimizer = build_optimizer(chunks, cfg.optimizer, cfg.precision.dtype, t.lr, t.min_lr)
            scheduler = build_scheduler(optimizer, cfg.optimizer, cfg.schedule, t.total_iters(), t.lr, t.min_lr)
        Checkpointer(f"{output_root}/{name}").save(chunks, optimizer, scheduler, TrainState(iteration=7), None,
                                                   cfg.to_dict())
        results[name] = score(chunks, variant["batches"], variant["output"])
    return results


def load_and_score(rank: int, overrides: list[str], checkpoint_root: str, batches: list[torch.Tensor],
                   outputs: list[str]) -> dict[str, list[torch.Tensor]] | None:
    """Build at the layout of `overrides`, load a (converted) checkpoint root the way the trainer starts
    from `checkpoint.load` with `load_optimizer=false`, and score the batches for each of `outputs`."""
    from pathlib import Path

    from cplm_megatron.checkpoint.checkpointer import Checkpointer
    from cplm_megatron.checkpoint.lookup import read_latest

    cfg = load_run_config(None, overrides)
    chunks = build(cfg)
    Checkpointer(Path(checkpoint_root)).load(read_latest(Path(checkpoint_root)), chunks, None, None,
                                             load_optimizer=False)
    scores = {output: score(chunks, batches, output) for output in outputs}
    return None if any(s is None for s in scores.values()) else scores


def convert_from_hf_jobs(rank: int, jobs: list[dict]) -> list[str]:
    """Run `convert_from_hf(**job)` for each job in this one process (as the CLI does, one at a time)."""
    from cplm_megatron.hf.convert import convert_from_hf

    return [str(convert_from_hf(**job)) for job in jobs]


def convert_and_score(rank: int, jobs: list[dict], batches: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Per job {"hf_dir", "output"}: convert_from_hf (no copy head), then load the root at TP=PP=1 the way the
    trainer continues from it and return Megatron's logits of the batches (one process: one megatron import)."""
    from pathlib import Path

    from cplm_megatron.checkpoint.lookup import read_saved_config
    from cplm_megatron.hf.convert import continue_overrides, convert_from_hf

    logits = {}
    for job in jobs:
        root = convert_from_hf(job["hf_dir"], job["output"], copy_head=False)
        saved = read_saved_config(Path(root) / "iter_0000000")
        overrides = [item for item in continue_overrides(Path(root), saved) if not item.startswith("checkpoint.")]
        logits[job["output"]] = load_and_score(rank, overrides, str(root), batches, ["logits"])["logits"]
    return logits
