"""A batch of the data loader as the model's call arguments (`model_inputs`): what the trainer's step, the
evaluators' scorers and the benchmarks feed CPLMGPTModel."""
from __future__ import annotations

from typing import Dict

import torch

from cplm_megatron.model.document_mask import document_ids_mask
from cplm_megatron.parallel.context import split_batch


def model_inputs(batch: Dict[str, torch.Tensor], device: torch.device, document_masking: bool) -> Dict:
    """Batch dict (tokens/labels/loss_mask/position_ids/document_ids) -> model call arguments.

    Document ids always reach the copy head (its candidates never cross a document, docs/design.md);
    `document_masking` decides only the attention: per document, or plain causal over the packed row.
    The attention mask is the document ids themselves (`model/document_mask.py`: each core attention builds
    what it needs, SDPA no `[s, s]` tensor). Under context parallelism every other tensor is this CP rank's
    part of the sequence (Megatron's load-balanced split); the mask keeps the whole sequence's ids.
    """
    tokens = batch["tokens"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    loss_mask = batch["loss_mask"].to(device, non_blocking=True).float()
    if "position_ids" in batch:
        position_ids = batch["position_ids"].to(device, non_blocking=True)
    else:
        position_ids = torch.arange(tokens.shape[1], device=device)[None].expand_as(tokens)
    doc_ids = batch.get("document_ids")
    if doc_ids is not None:
        doc_ids = doc_ids.to(device, non_blocking=True)
    attention_mask = document_ids_mask(doc_ids) if document_masking and doc_ids is not None else None
    inputs = split_batch(dict(input_ids=tokens, position_ids=position_ids.contiguous(), labels=labels,
                              loss_mask=loss_mask, document_ids=doc_ids))
    return dict(inputs, attention_mask=attention_mask)
