"""Worker functions for copy-head model tests (run inside spawned processes with Megatron state)."""
from __future__ import annotations

from typing import Dict

import torch

from cplm_megatron.model.config import load_preset
from cplm_megatron.model.copy_head import CopyHeadConfig
from cplm_megatron.parallel.distributed import ParallelConfig

COPY = dict(heads=2, head_dim=16, impl="chunked", block_size=16)


def _model(parallel: ParallelConfig, copy: CopyHeadConfig | None, seed: int = 7, **overrides):
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.layout import init_distributed

    cfg = load_preset("tiny", **overrides)
    init_distributed(parallel, cfg, seed=seed)
    chunks = build_run(model_run(cfg, copy, parallel, seq_len=256)).chunks
    return cfg, chunks


def _inputs(b: int, s: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 40, (b, s + 1), generator=g)  # small alphabet: many copy matches
    pos = torch.arange(s)[None].repeat(b, 1)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous(), pos


def causality(rank: int) -> Dict:
    """Per-token losses before/after changing every token after position t+1."""
    _, [model] = _model(ParallelConfig(), CopyHeadConfig(**COPY))
    x, y, pos = _inputs(2, 48, 4096)
    results = []
    with torch.no_grad():
        base = model(x, pos, None, labels=y)
        for t in (0, 5, 20, 46):
            full = torch.cat([x, y[:, -1:]], dim=1)
            changed = full.clone()
            changed[:, t + 2:] = torch.randint(40, 80, changed[:, t + 2:].shape)
            loss = model(changed[:, :-1], pos, None, labels=changed[:, 1:])
            # bitwise: later tokens are masked to exact zeros in every sum up to position t
            results.append((t, torch.equal(loss[:, : t + 1], base[:, : t + 1]),
                            bool((loss[:, t + 1:] != base[:, t + 1:]).any()) if t + 1 < 48 else True))
    return {"results": results}


def no_candidate_positions(rank: int) -> Dict:
    """Gate and loss where t has no candidate (t=0, document starts, masked history)."""
    _, [model] = _model(ParallelConfig(), CopyHeadConfig(**COPY))
    x, y, pos = _inputs(2, 32, 4096)
    doc = torch.zeros_like(x)
    doc[:, 16:] = 1
    mask = torch.ones(x.shape)
    mask[1, :8] = 0  # no usable candidates before position 8 in row 1
    with torch.no_grad():
        _, out = model(x, pos, None, labels=y, loss_mask=mask, document_ids=doc, output="loss_and_copy")
    return {"gate": out.gate, "loss": out.loss, "lm_ce": out.lm_ce, "has_candidate": out.has_candidate}


def distribution(rank: int, tp: int) -> Dict:
    """Vocab-sharded mixture log-probs: sum of exp over all shards, and value at y_t vs the loss."""
    from megatron.core import parallel_state as ps

    from cplm_megatron.checkpoint.weights import load_weights
    from cplm_megatron.model.cplm_gpt import labels_from_inputs

    parallel = ParallelConfig(tp=tp)
    _, [model] = _model(parallel, CopyHeadConfig(**COPY))
    x, y, pos = _inputs(2, 40, 4096, seed=3)
    mask = torch.ones(x.shape)
    mask[:, -2:] = 0
    with torch.no_grad():
        loss = model(x, pos, None, labels=y, loss_mask=mask)
        logp = model(x, pos, None, labels=y, loss_mask=mask, output="log_probs")  # [b, s, V/tp]
        gathered = model(x, pos, None, labels=y, loss_mask=mask, output="log_probs_gathered")
        without_labels = model(x, pos, None)  # where GPTModel returns logits
        from_inputs = model(x, pos, None, labels=labels_from_inputs(x), output="log_probs")
        head, model.copy_head = model.copy_head, None
        lm_only = model(x, pos, None, labels=y, output="log_probs")  # the LM head's log-probs alone
        model.copy_head = head
    mass = logp.exp().sum(-1)
    if tp > 1:
        torch.distributed.all_reduce(mass, group=ps.get_tensor_model_parallel_group())
    v0 = ps.get_tensor_model_parallel_rank() * logp.shape[-1]
    local = (y >= v0) & (y < v0 + logp.shape[-1])
    at_target = torch.where(local, logp.gather(-1, (y - v0).clamp(0, logp.shape[-1] - 1)[..., None])[..., 0], 0.0)
    if tp > 1:
        torch.distributed.all_reduce(at_target, group=ps.get_tensor_model_parallel_group())
    del load_weights
    return {"mass": mass, "at_target": at_target, "loss": loss, "mask": mask, "gathered_shape": tuple(gathered.shape),
            "gathered_at_target": gathered.gather(-1, y[..., None])[..., 0],
            "without_labels_is_the_mixture": torch.equal(without_labels, from_inputs),  # one code path, same inputs
            "mixture_differs_from_lm": bool((without_labels - lm_only).abs().max() > 0.1)}


def disabled_is_plain_backbone(rank: int) -> Dict:
    """CPLMGPTModel(copy_head disabled) vs Megatron's GPTModel from the same seed."""
    from megatron.core.models.gpt import GPTModel

    from cplm_megatron.model.builder import layer_spec, transformer_config
    from cplm_megatron.parallel.distributed import set_seed

    cfg, [cplm] = _model(ParallelConfig(), CopyHeadConfig(enabled=False))
    set_seed(7)
    plain = GPTModel(config=transformer_config(cfg, ParallelConfig()), transformer_layer_spec=layer_spec(cfg, False),
                     vocab_size=cfg.padded_vocab_size, max_sequence_length=256, share_embeddings_and_output_weights=True,
                     position_embedding_type="rope", rotary_base=10000)
    set_seed(7)
    _, [again] = _model(ParallelConfig(), CopyHeadConfig(enabled=False))  # rebuilt from the same seed
    names_equal = [n for n, _ in cplm.named_parameters()] == [n for n, _ in plain.named_parameters()]
    plain.load_state_dict(again.state_dict())
    x, y, pos = _inputs(2, 32, 4096)
    cplm_loss = cplm(x, pos, None, labels=y)
    plain_loss = plain(x, pos, None, labels=y)
    cplm_loss.sum().backward()
    plain_loss.sum().backward()
    # bitwise: with the head disabled both models run the same Megatron ops on the same weights and batch
    grads_equal = all(torch.equal(a.grad, b.grad) for a, b in zip(cplm.parameters(), plain.parameters()))
    params_equal = all(torch.equal(a, b) for a, b in zip(cplm.parameters(), again.parameters()))
    return {"names_equal": names_equal, "params_equal": params_equal, "loss_equal": torch.equal(cplm_loss, plain_loss),
            "grads_equal": grads_equal, "n_params": sum(p.numel() for p in cplm.parameters()),
            "n_plain": sum(p.numel() for p in plain.parameters())}


def spamlang_learning(rank: int, steps: int) -> Dict:
    """Train a tiny CPLM on SpamLang with the real train step; accuracy of the mixture argmax per step."""
    from cplm_megatron.data.synthetic import SyntheticLoader, synthetic_val_batches
    from cplm_megatron.training.optimizer import (
        OptimizerConfig,
        ScheduleConfig,
        build_optimizer,
        build_scheduler,
        wrap_ddp,
    )
    from cplm_megatron.training.step import setup_model_config, train_step

    parallel = ParallelConfig()
    copy = CopyHeadConfig(heads=2, head_dim=32, impl="chunked")
    cfg, chunks = _model(parallel, copy, num_layers=2, hidden_size=64, num_attention_heads=2, num_query_groups=1,
                         ffn_hidden_size=128)
    opt_cfg = OptimizerConfig()
    chunks = wrap_ddp(chunks, opt_cfg, bf16=False)
    opt = build_optimizer(chunks, opt_cfg, "fp32", lr=3e-3, min_lr=3e-3)
    sched = build_scheduler(opt, opt_cfg, ScheduleConfig(style="constant"), steps, lr=3e-3, min_lr=3e-3)
    setup_model_config(chunks, opt)
    loader = SyntheticLoader("spamlang", 32, cfg.vocab_size, 8, 0, 1, seed=1)
    val = synthetic_val_batches("spamlang", 2, 16, 32, cfg.vocab_size, 0, 1)
    model = chunks[0]
    acc = []
    for _ in range(steps):
        train_step(chunks, opt, sched, [next(loader)], 32, 8)
        with torch.no_grad():
            hits = total = 0
            for b in val:
                lp = model(b["tokens"], b["position_ids"], None, labels=b["labels"], output="log_probs_gathered")
                pred = lp.argmax(-1)
                hits += (pred[:, 1:] == b["labels"][:, 1:]).sum().item()  # position 0 cannot know the symbol
                total += b["labels"][:, 1:].numel()
            acc.append(hits / total)
    return {"acc": acc, "vocab": cfg.vocab_size, "hidden": cfg.hidden_size}


def training_batch_path(rank: int, overrides: list) -> Dict:
    """Run pretrain_cplm.py's training path (Trainer: streaming loader -> collate -> train_step ->
    forward_step -> model_inputs -> CPLMGPTModel) for one step and record, on the last pipeline stage,
    what the model and its copy head received and what the head returned."""
    from pathlib import Path

    from cplm_megatron.run_config import load_run_config
    from cplm_megatron.training.trainer import Trainer

    repo = Path(__file__).resolve().parents[2]
    trainer = Trainer(load_run_config(str(repo / "configs" / "tiny.yaml"), overrides))
    calls = []
    for chunk in trainer.chunks:
        model = chunk.module  # DDP -> CPLMGPTModel
        if model.copy_head is None:
            continue

        def model_call(_module, _args, kwargs):
            calls.append({"tokens": kwargs["input_ids"].clone(), "attention_mask": kwargs["attention_mask"],
                          "position_ids": kwargs["position_ids"].clone()})

        def head_call(_module, args, out):
            calls[-1].update(document_ids=args[4], gate=out.gate.detach().clone(),
                             has_candidate=out.has_candidate.clone())

        model.register_forward_pre_hook(model_call, with_kwargs=True)
        model.copy_head.register_forward_hook(head_call)
    trainer.run()
    return {"calls": calls}


def native_inference(rank: int) -> Dict:
    """Megatron's own inference path (a static inference context): refused with the copy head, served without."""
    from megatron.core.inference.contexts import StaticInferenceContext

    x, _, pos = _inputs(2, 16, 4096)
    results = {}
    for name, copy in (("cplm", CopyHeadConfig(**COPY)), ("baseline", CopyHeadConfig(enabled=False))):
        if name == "baseline":
            from megatron.core import parallel_state as ps

            ps.destroy_model_parallel()
        _, [model] = _model(ParallelConfig(), copy)
        model.eval()
        context = StaticInferenceContext(max_batch_size=2, max_sequence_length=64)
        try:
            with torch.no_grad():
                out = model(x, pos, None, inference_context=context, runtime_gather_output=True)
            results[name] = ("ok", tuple(out.shape))
        except NotImplementedError as err:
            results[name] = ("refused", str(err))
    return results
