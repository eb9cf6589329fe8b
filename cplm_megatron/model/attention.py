"""Core attention through torch's `scaled_dot_product_attention` (SDPA) for the local layer spec.

megatron-core's local `DotProductAttention` is unfused: it materialises `[b, heads/tp, s, s]` scores and keeps
fp32 and 16-bit copies of the probabilities for the backward. `SDPAttention` has its constructor and forward
signature (a drop-in `core_attention` submodule) and calls SDPA instead:

* causal, no document mask: `is_causal=True` -- flash attention on CUDA (and torch's fused CPU kernel), no
  `[s, s]` tensor at all;
* `data.document_masking`: the step passes every token's document id (`document_mask.py`), never an `[s, s]`
  mask; without context parallelism each document is its own causal attention, by the backend chosen once at
  model build and logged (`document_mask.select_document_backend`): on CUDA torch's flash varlen kernel
  (`torch.nn.attention.varlen.varlen_attn`, either signature) where torch has it, else nested jagged tensors;
  on CPU (and with attention dropout, which varlen lacks) one SDPA call per document: exact block-diagonal
  causal attention with no `[s, s]` tensor. A dense boolean mask (`[b, 1, s, s]`, True = masked) still works:
  one additive bias per micro-batch, shared by every layer (kept on the mask object);
* GQA: key/value groups repeated to the local heads only where the kernel needs it (`enable_gqa` otherwise);
* TP: local heads (heads/tp, groups/tp); SP and PP need nothing here (q/k/v arrive full-sequence);
* CP (`parallel.cp`): q/k/v hold this rank's two chunks of the load-balanced split; k/v are all-gathered
  over the CP group (megatron's `all_gather` comm type; the backward reduce-scatters their gradients to the
  owners) and the causal / document mask is in global positions (`[b, 1, s/cp, s]`: the step slices the
  document mask's query rows; causal attention runs each of the rank's two chunks lower-right causal against
  the keys up to its end, without a mask tensor);
* attention dropout with the tensor-parallel RNG tracker, as DotProductAttention does.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide
from torch.nn.attention.bias import causal_lower_right

from cplm_megatron.model.document_mask import (
    DocumentSpans,
    dense_document_mask,
    document_spans,
    is_document_ids,
    log_document_backend,
    select_document_backend,
    varlen_attn_function,
    varlen_call_kwargs,
)
from cplm_megatron.parallel.context import gather_sequence, this_rank_positions

ATTENTION_IMPLS = ("auto", "sdpa", "megatron", "te")


class SDPAttention(MegatronModule):
    """DotProductAttention's interface (q/k/v `[s, b, heads, head_dim]` -> `[s, b, heads*head_dim]`) on SDPA."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Any = None,
        **_unused: Any,
    ):
        super().__init__(config=config)
        self.cp = config.context_parallel_size
        if getattr(config, "softmax_type", "vanilla") != "vanilla" or getattr(config, "window_size", None):
            raise ValueError("SDPA attention supports the vanilla softmax without a sliding window")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        tp = self.tp_group.size()
        projection = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection, tp)
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups or config.num_attention_heads, tp)
        # apply_query_key_layer_scaling divides the scores by layer_number and the softmax multiplies them back:
        # the net scale is the plain one.
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        # document masking's kernel, chosen once here (the benchmark may set another available one)
        self.document_backend = select_document_backend(torch.cuda.is_available(), dropout=self.dropout_p > 0)
        log_document_backend(self.document_backend)

    @staticmethod
    def _mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Megatron's boolean mask (True = masked) -> SDPA's additive bias (0 / -inf), computed once per mask:
        the step passes one mask object to every layer of a micro-batch, so the bias rides on that object (and
        is freed with it)."""
        cached = getattr(mask, "_cplm_sdpa_bias", None)
        if cached is not None and cached.dtype == dtype:
            return cached
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
        mask._cplm_sdpa_bias = bias
        return bias

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params: Any = None,
        **_unused: Any,
    ) -> torch.Tensor:
        """q `[sq, b, heads, d]`, k/v `[sk, b, groups, d]`, mask `[b, 1, sq, sk]` bool (True = masked) or None."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPA attention takes an attention mask, not packed_seq_params or attention_bias")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if self.cp > 1:  # context parallelism: local queries, every rank's keys/values in global order
            key, value = gather_sequence(key, dim=0), gather_sequence(value, dim=0)
            if attention_mask is None and mask_type == AttnMaskType.causal:
                return self._cp_causal(query, key, value)
            if is_document_ids(attention_mask):  # this rank's query rows against every key: [b, 1, s/cp, s]
                attention_mask = dense_document_mask(attention_mask, this_rank_positions(query.shape[0], query.device))
        elif is_document_ids(attention_mask):
            return self._documents(query, key, value, attention_mask)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads|groups, s, d]
        rep = self.heads // self.groups
        kwargs: dict = {}
        if attention_mask is not None:
            kwargs["attn_mask"] = self._mask_bias(attention_mask, q.dtype)
        else:
            kwargs["is_causal"] = mask_type == AttnMaskType.causal and q.shape[2] > 1
        if rep > 1:
            if attention_mask is None:
                kwargs["enable_gqa"] = True  # flash takes grouped k/v as they are
            else:  # the memory-efficient kernel (masks) wants one k/v head per query head
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = self._sdpa(q, k, v, **kwargs)
        # [b, heads, sq, d] -> [sq, b, heads * d]
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], self.hidden_size_per_partition)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """SDPA with this module's scale and dropout (the TP RNG tracker's stream, as DotProductAttention)."""
        dropout = self.dropout_p if self.training else 0.0
        if dropout and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=self.softmax_scale, **kwargs)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=self.softmax_scale, **kwargs)

    @torch.compiler.disable  # data-dependent spans: eager inside a compiled layer (model.compile)
    def _documents(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
                   ) -> torch.Tensor:
        """Causal attention within each document of the document-ids mask (`[s, b, n, d]` -> `[s, b, n*d]`)."""
        spans = document_spans(mask)
        s, b = query.shape[:2]
        rep = self.heads // self.groups
        backend = self.document_backend if query.is_cuda else "per_document"
        if backend == "varlen":
            return self._documents_varlen(query, key, value, spans)
        if backend == "njt":  # nested jagged tensors through SDPA
            q, k, v = (t.transpose(0, 1).reshape(b * s, t.shape[2], t.shape[3]) for t in (query, key, value))
            if rep > 1:  # it takes one k/v head per query head
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

            def nested(t: torch.Tensor) -> torch.Tensor:
                return torch.nested.nested_tensor_from_jagged(t, spans.offsets, max_seqlen=spans.max_len).transpose(1, 2)

            out = self._sdpa(nested(q), nested(k), nested(v), is_causal=True).transpose(1, 2).values()
            return out.reshape(b, s, self.hidden_size_per_partition).transpose(0, 1).contiguous()
        rows: list[list[torch.Tensor]] = [[] for _ in range(b)]
        for lo, hi in zip(spans.bounds, spans.bounds[1:]):  # one SDPA call per document, on views of q/k/v
            row, start, end = lo // s, lo % s, lo % s + hi - lo
            doc = [t[start:end, row].transpose(0, 1)[None] for t in (query, key, value)]  # [1, heads|groups, L, d]
            rows[row].append(self._sdpa(*doc, is_causal=True, enable_gqa=rep > 1)[0].transpose(0, 1))
        out = torch.stack([torch.cat(pieces) for pieces in rows], dim=1)  # [s, b, heads, d]
        return out.reshape(s, b, self.hidden_size_per_partition)

    def _documents_varlen(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, spans: DocumentSpans
                          ) -> torch.Tensor:
        """torch's flash varlen kernel: tokens packed row after row, documents by cumulative offsets (int32);
        `is_causal` or `window_size` as this torch's signature takes it; grouped k/v as they are where it takes
        `enable_gqa`, else repeated to one head per query head."""
        s, b = query.shape[:2]
        rep = self.heads // self.groups
        q, k, v = (t.transpose(0, 1).reshape(b * s, t.shape[2], t.shape[3]) for t in (query, key, value))
        fn = varlen_attn_function()
        kwargs = varlen_call_kwargs(fn, self.softmax_scale, gqa=rep > 1)
        if rep > 1 and "enable_gqa" not in kwargs:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        cu = spans.offsets.to(torch.int32)
        out = fn(q, k, v, cu, cu, spans.max_len, spans.max_len, **kwargs)
        return out.reshape(b, s, self.hidden_size_per_partition).transpose(0, 1).contiguous()

    def _cp_causal(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Causal attention of this CP rank's two query chunks against the gathered keys: each chunk is the
        last rows of the keys up to its end, i.e. lower-right causal (flash / memory-efficient kernels on CUDA,
        no [s/cp, s] mask, the keys after the chunk not even read)."""
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads|groups, s, d]
        local, chunk = q.shape[2], q.shape[2] // 2
        positions = this_rank_positions(local, q.device)
        outs = []
        for lo, hi in ((0, chunk), (chunk, local)):
            end = int(positions[hi - 1]) + 1
            outs.append(self._sdpa(q[:, :, lo:hi], k[:, :, :end], v[:, :, :end], enable_gqa=self.heads != self.groups,
                                   attn_mask=causal_lower_right(hi - lo, end)))
        out = torch.cat(outs, dim=2)
        return out.permute(2, 0, 1, 3).reshape(local, out.shape[0], self.hidden_size_per_partition)


class DocumentMaskedDotProductAttention(DotProductAttention):
    """megatron-core's unfused attention, given document ids (`document_mask.py`) as its dense boolean mask."""

    def forward(self, query, key, value, attention_mask, *args, **kwargs):
        if is_document_ids(attention_mask):
            attention_mask = dense_document_mask(attention_mask)
        return super().forward(query, key, value, attention_mask, *args, **kwargs)


def core_attention_class(impl: str):
    """The core-attention module class for a resolved `model.attention_impl` ("sdpa" or "megatron")."""
    if impl == "sdpa":
        return SDPAttention
    if impl == "megatron":
        return DocumentMaskedDotProductAttention
    raise ValueError(f"no local core attention for model.attention_impl={impl!r}")
