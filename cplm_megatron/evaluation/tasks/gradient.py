"""`gradient`: the LM-head gradient bottleneck and the Copy-Paste head's share of the backbone gradient.

On one batch, with L = the training loss (mean over loss-masked tokens of the per-token loss: the
mixture NLL for CPLM, the LM cross entropy for a baseline) and h = the final (normed) hidden states:

* G = dL/dz, the gradient w.r.t. the LM-head logits z = h W^T (rows: positions, [N, V]). Only its
  component inside the column space of W ([V, d], d << V) reaches h, since dL/dh = G W and
  W^T (I - P) = 0 for P the projection onto span(W). Reported (Godey & Artzi):
  `logit_grad_outside_span` = ||(I - P) G||_F / ||G||_F, with P = Q Q^T from the QR of W
  (and `logit_grad_inside_span` = ||P G||_F / ||G||_F, the retained fraction). Its chance value:
  a gradient with no relation to W keeps d/V of its energy inside span(W), so
  `logit_grad_outside_span_chance` = sqrt(1 - d/V) (0.992 at V/d = 64), and `retained_over_chance`
  = (1 - outside^2) / (d/V) says how many times chance the retained energy is (1: no structure).
  The projection runs over row chunks in float64 (never an fp64 [N, V] matrix: 4.3 GB at V = 131072).
* h feeds two heads. Split the backbone's gradient dL/dh = g = g_lm + g_copy by path: g_lm flows
  through the LM head (G W), g_copy through the Copy-Paste head (queries, keys, gate). Reported:
  their Frobenius norms over the batch; `copy_grad_share` = ||g_copy|| / (||g_lm|| + ||g_copy||)
  (norms only: blind to cancellation); and the cosine-based split `copy_grad_projection` =
  <g_copy, g> / ||g||^2 (with `lm_grad_projection` = <g_lm, g> / ||g||^2 they sum to 1; a path
  working against the other has a negative share) and `copy_lm_grad_cosine` = cos(g_copy, g_lm),
  Frobenius inner products over the batch (0 / 1 / nan for a baseline).

Each path is measured by autograd on two detached copies of h fed to the model's own head modules.
"""
from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass

import torch

from cplm_megatron.data.synthetic import copy_sample, spamlang_sample
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import (
    Batch,
    HFScorer,
    MegatronScorer,
    Scorer,
    document_segments,
)
from cplm_megatron.evaluation.tasks.base import TaskResult
from cplm_megatron.evaluation.tasks.copy import check_length


@dataclass
class HeadGradients:
    """Gradients of the training loss on one batch, split by head."""

    loss: float
    logit_grad: torch.Tensor  # [N, V] dL/dz of the LM head, one row per position
    lm_weight: torch.Tensor  # [V, d] the LM-head (output) matrix
    hidden_grad_lm: torch.Tensor  # [N, d] dL/dh through the LM head
    hidden_grad_copy: torch.Tensor | None  # [N, d] dL/dh through the Copy-Paste head (None: no head)


CHUNK_ELEMENTS = 1 << 23  # float64 elements per row chunk of the projection (64 MB)


LOGIT_ELEMENTS = 1 << 24  # logits per sequence chunk of the task's batch (64 MB in fp32; G and its copies alike)


def span_basis(weight: torch.Tensor) -> torch.Tensor:
    """[V, d] float64 orthonormal basis of the column space of weight [V, d]."""
    return torch.linalg.qr(weight.double())[0]


def span_sums(logit_grad: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    """(||(I - P) G||_F^2, ||G||_F^2) for P = q q^T, in float64 over chunks of rows (CHUNK_ELEMENTS each), so
    memory stays O(V d + chunk) at any N."""
    rows = max(1, CHUNK_ELEMENTS // max(1, logit_grad.shape[-1]))
    outside_sq = total_sq = 0.0
    for start in range(0, logit_grad.shape[0], rows):
        g = logit_grad[start:start + rows].double()
        outside = g - (g @ q) @ q.T
        outside_sq += float((outside * outside).sum())
        total_sq += float((g * g).sum())
    return outside_sq, total_sq


def outside_span_fraction(logit_grad: torch.Tensor, weight: torch.Tensor) -> float:
    """||(I - P) G||_F / ||G||_F for P the orthogonal projection onto the column space of weight [V, d]."""
    outside_sq, total_sq = span_sums(logit_grad, span_basis(weight))
    return (outside_sq / total_sq) ** 0.5 if total_sq > 0 else float("nan")


def chance_outside_span(weight: torch.Tensor) -> float:
    """sqrt(1 - d/V): the outside-span fraction of a gradient unrelated to W [V, d] (d = its rank, <= V)."""
    vocab, width = weight.shape
    return (1.0 - min(width, vocab) / vocab) ** 0.5


def megatron_head_gradients(scorer: MegatronScorer, batch: Batch, normalizer: float | None = None) -> HeadGradients:
    """Head gradients of a Megatron CPLMGPTModel (tp = 1): backbone once without grad, heads with autograd."""
    model = scorer.model
    inputs = scorer.model_inputs(batch)
    captured: list[torch.Tensor] = []
    handle = model.decoder.register_forward_hook(lambda _module, _args, output: captured.append(output))
    try:
        with torch.no_grad():
            model(inputs["input_ids"], inputs["position_ids"], inputs["attention_mask"])
    finally:
        handle.remove()
    hidden = captured[0].detach()  # [s, b, d], after the final norm
    h_lm = hidden.clone().requires_grad_(True)
    h_copy = hidden.clone().requires_grad_(True)
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(h_lm, weight=weight)  # [s, b, V]
    labels, mask = inputs["labels"], inputs["loss_mask"]
    per_token = model.compute_language_model_loss(labels, logits)  # [b, s]
    if model.copy_head is not None:
        per_token = model.copy_head(h_copy.transpose(0, 1), per_token, labels, mask, inputs["document_ids"]).loss
    loss = (per_token * mask).sum() / (normalizer if normalizer is not None else mask.sum())
    wrt = [logits, h_lm] + ([h_copy] if model.copy_head is not None else [])
    grads = torch.autograd.grad(loss, wrt)
    w = weight if weight is not None else model.output_layer.weight
    d = hidden.shape[-1]
    return HeadGradients(
        float(loss.detach()),
        grads[0].transpose(0, 1).reshape(-1, grads[0].shape[-1]).detach(),
        w.detach(),
        grads[1].transpose(0, 1).reshape(-1, d),
        grads[2].transpose(0, 1).reshape(-1, d) if len(grads) == 3 else None,
    )


def hf_head_gradients(scorer: HFScorer, batch: Batch, normalizer: float | None = None) -> HeadGradients:
    """Head gradients of an HF export, one document segment at a time (same loss normalization)."""
    model = scorer.model
    modeling = importlib.import_module(type(model).__module__)  # the export's own modeling_cplm
    copy_head = getattr(model, "copy_head", None)
    total_tokens = normalizer if normalizer is not None else batch["loss_mask"].sum()
    logit_rows, lm_rows, copy_rows, loss = [], [], [], 0.0
    for row, start, end in document_segments(batch):
        ids = batch["tokens"][row:row + 1, start:end]
        labels = batch["labels"][row, start:end]
        mask = batch["loss_mask"][row, start:end].float()
        with torch.no_grad():
            hidden = model.model(input_ids=ids).last_hidden_state  # [1, n, d], final-normed
        h_lm = hidden.detach().clone().requires_grad_(True)
        h_copy = hidden.detach().clone().requires_grad_(True)
        logits = model.lm_head(h_lm)
        if copy_head is not None:
            n = ids.shape[1]
            log_p_copy, has_candidate, lse = modeling.copy_log_probs(
                copy_head.queries(h_copy), copy_head.keys(h_copy), modeling.candidate_labels(ids),
                modeling.candidate_mask(torch.ones_like(ids, dtype=torch.bool), torch.arange(n)),
                model.config.vocab_size, return_lse=True)
            # every mixing rule (gate, constant, sentinel) through the head's own weights; sentinel reads lse
            weights = copy_head.mixture_weights(h_copy, has_candidate, lse)
            log_probs = modeling.mixture_log_probs(logits, weights, log_p_copy, has_candidate)
        else:
            log_probs = torch.log_softmax(logits.float(), dim=-1)
        nll = -log_probs[0].gather(-1, labels[:, None]).squeeze(-1)
        segment_loss = (nll * mask).sum() / total_tokens
        wrt = [logits, h_lm] + ([h_copy] if copy_head is not None else [])
        grads = torch.autograd.grad(segment_loss, wrt)
        loss += float(segment_loss.detach())
        logit_rows.append(grads[0][0].float())
        lm_rows.append(grads[1][0])
        if copy_head is not None:
            copy_rows.append(grads[2][0])
    return HeadGradients(loss, torch.cat(logit_rows), model.lm_head.weight.detach(), torch.cat(lm_rows),
                         torch.cat(copy_rows) if copy_head is not None else None)


def head_gradients(scorer: Scorer, batch: Batch, normalizer: float | None = None) -> HeadGradients:
    """Dispatch on the backend; `normalizer`: the loss's token count (default: this batch's loss-masked tokens)."""
    if isinstance(scorer, MegatronScorer):
        return megatron_head_gradients(scorer, batch, normalizer)
    if isinstance(scorer, HFScorer):
        return hf_head_gradients(scorer, batch, normalizer)
    raise TypeError(f"task gradient: unsupported scorer {type(scorer).__name__}")


def gradient_batch(scorer: Scorer, options: EvalOptions) -> Batch:
    """The batch of `options.gradient_source`: synthetic copy / SpamLang sequences or validation samples."""
    from cplm_megatron.data.synthetic import make_batch

    n = options.sequences("gradient")
    if options.gradient_source == "val":
        from cplm_megatron.evaluation.tasks.val import open_val_loader, val_paths

        loader = open_val_loader(val_paths(scorer, options), n, scorer.document_masking, scorer.vocab_size)
        return next(itertools.islice(iter(loader), 1))
    if options.gradient_source == "spamlang":
        check_length(options.spamlang_length, scorer, "spamlang_length")
        samples = [spamlang_sample(i, options.spamlang_length, scorer.vocab_size, options.eval_seed) for i in range(n)]
    else:
        check_length(options.copy_length, scorer, "copy_length")
        samples = [copy_sample(i, options.copy_length, scorer.vocab_size, options.eval_seed)[0] for i in range(n)]
    return make_batch(samples)


def gradient_figures(grads: HeadGradients, span: tuple[float, float] | None = None) -> dict:
    """The reported numbers of one batch's head gradients (`span`: its `span_sums`, when G was not kept)."""
    g_lm = grads.hidden_grad_lm.double()
    g_copy = grads.hidden_grad_copy.double() if grads.hidden_grad_copy is not None else torch.zeros_like(g_lm)
    lm_norm, copy_norm = float(torch.linalg.norm(g_lm)), float(torch.linalg.norm(g_copy))
    total = g_lm + g_copy
    total_sq = float((total * total).sum())
    nan = float("nan")
    outside_sq, logit_sq = span if span is not None else span_sums(grads.logit_grad, span_basis(grads.lm_weight))
    outside = (outside_sq / logit_sq) ** 0.5 if logit_sq > 0 else nan
    vocab, width = grads.lm_weight.shape
    chance_retained = min(width, vocab) / vocab
    return {
        "logit_grad_outside_span": outside,
        "logit_grad_inside_span": (1.0 - outside**2) ** 0.5,
        "logit_grad_outside_span_chance": chance_outside_span(grads.lm_weight),
        "retained_over_chance": (1.0 - outside**2) / chance_retained,
        "hidden_grad_norm_lm": lm_norm,
        "hidden_grad_norm_copy": copy_norm,
        "copy_grad_share": copy_norm / (lm_norm + copy_norm) if lm_norm + copy_norm > 0 else nan,
        "copy_grad_projection": float((g_copy * total).sum()) / total_sq if total_sq > 0 else nan,
        "lm_grad_projection": float((g_lm * total).sum()) / total_sq if total_sq > 0 else nan,
        "copy_lm_grad_cosine": (float((g_copy * g_lm).sum()) / (lm_norm * copy_norm)
                                if lm_norm * copy_norm > 0 else nan),
        "gradient_batch_loss": grads.loss,
    }


def _rows(batch: Batch, start: int, end: int) -> Batch:
    return {k: v[start:end] for k, v in batch.items()}


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    """The batch in chunks of sequences (<= LOGIT_ELEMENTS logits each; the loss keeps the whole batch's
    normalization, and both heads act per sequence, so the gradients are the whole batch's), figures from
    the accumulated sums: memory is bounded at any vocabulary (SpamLang at V = 131072)."""
    batch = gradient_batch(scorer, options)
    b, s = batch["tokens"].shape
    rows = max(1, LOGIT_ELEMENTS // (s * scorer.vocab_size))
    normalizer = float(batch["loss_mask"].sum())
    q, weight, outside_sq, total_sq, loss, lm_rows, copy_rows = None, None, 0.0, 0.0, 0.0, [], []
    for start in range(0, b, rows):
        grads = head_gradients(scorer, _rows(batch, start, start + rows), normalizer)
        if q is None:
            weight, q = grads.lm_weight, span_basis(grads.lm_weight)
        part = span_sums(grads.logit_grad, q)
        outside_sq, total_sq, loss = outside_sq + part[0], total_sq + part[1], loss + grads.loss
        lm_rows.append(grads.hidden_grad_lm)
        if grads.hidden_grad_copy is not None:
            copy_rows.append(grads.hidden_grad_copy)
        del grads
    merged = HeadGradients(loss, torch.empty(0), weight, torch.cat(lm_rows), torch.cat(copy_rows) if copy_rows else None)
    return TaskResult("gradient", gradient_figures(merged, (outside_sq, total_sq)),
                      {"source": options.gradient_source, "sequences": b, "length": s,
                       "lm_head_shape": list(weight.shape), "sequences_per_chunk": rows})
