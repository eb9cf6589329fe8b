"""Hugging Face model code for Copy-Paste Language Models: a decoder backbone + the Copy-Paste head.

The backbone is the transformers decoder of ``config.cplm_backbone`` (a ``model_type``: ``llama`` by default,
``qwen3``, ...), found through transformers' own AutoModel mapping (``Qwen3Model`` for ``qwen3``): any decoder
whose forward returns final-normed ``last_hidden_state`` and a KV cache, as the Llama-derived families do.

Self-contained on purpose: this file is copied into every exported checkpoint directory and loaded
there with ``trust_remote_code=True``; it imports only torch, transformers and its siblings
``configuration_cplm.py`` and ``mixing.py`` (the mixing rule training uses, shipped with the export).
It runs on transformers 4.5x and 5.x.

Documents: with ``config.copy_reset_at_eod`` (default) copy candidates never cross an EOD token
(``config.copy_eod_token_id``): position t only copies from earlier positions of its own document,
a document's EOD belonging to it, exactly as training packs documents. Attention is not reset
(the backbone sees the whole prompt, as in training without document masking).

``CPLMForCausalLM.forward`` returns as ``logits`` the log-probabilities of the mixture
``p = (1 - g) p_LM + g p_copy`` (fp32, ``[batch, positions, vocab]``), so ``generate()``, sampling
and lm-eval work unchanged (a log-softmax of log-probabilities is the identity).

KV-cache generation: the copy keys and the token ids of every cached position are kept in a
``CopyKeyState`` stored as the attribute ``cplm_copy_state`` on the transformers cache object that
``generate()`` (or the caller) passes in. The state is validated against the cache length on every
call (a cropped cache, as in assisted decoding, crops the state; a cache filled without it is
rejected) and reordered by ``_reorder_cache`` during beam search. Only dynamic caches are supported.
The copy statistics a mixing rule may read (``copy_mixing: sentinel``: the candidates' log-sum-exp per
copy head) are recomputed from these keys for every new query, so the cache needs nothing more.
"""

import dataclasses
import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import (
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
)

from .configuration_cplm import CPLMConfig
from .mixing import CopyStats, MixtureWeights, mix_log_probs, mixing_rule, mixture_weights

_OUTPUT_CACHE_FIELD = (
    "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
)
_CACHE_NAMES = ("cache", "past_key_values")
COPY_STATE_ATTR = "cplm_copy_state"


def decoder_class(model_type: str) -> type:
    """The transformers decoder (base model) class of `model_type`: LlamaModel, Qwen3Model, ..."""
    if model_type == "llama":
        return LlamaModel
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"CPLMForCausalLM: cplm_backbone={model_type!r} has no decoder class in this transformers "
                         f"({transformers.__version__})")
    return cls


def _cache_kwarg(decoder: type) -> str:
    """transformers renamed the cache argument `past_key_values` -> `cache` (5.2x); use what is installed."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


@dataclasses.dataclass
class CopyKeyState:
    """Copy keys and token ids of every position already in the KV cache (candidates for later queries)."""

    keys: torch.Tensor  # [batch, copy_heads, cached_len, copy_head_dim], fp32, after the optional norm
    token_ids: torch.Tensor  # [batch, cached_len]

    @property
    def length(self) -> int:
        return self.token_ids.shape[1]

    @property
    def batch_size(self) -> int:
        return self.token_ids.shape[0]

    def cropped(self, length: int) -> "CopyKeyState":
        """The state of the first `length` positions (the cache was cropped)."""
        return CopyKeyState(self.keys[:, :, :length], self.token_ids[:, :length])

    def select_batch(self, index: torch.Tensor) -> "CopyKeyState":
        """Rows `index` of the state (beam-search reorder)."""
        index = index.to(self.token_ids.device)
        return CopyKeyState(self.keys.index_select(0, index), self.token_ids.index_select(0, index))


class CopyGate(nn.Linear):
    """The gate's `Linear(hidden, rows)` (1 row, or one sentinel per copy head for `copy_mixing: sentinel`);
    a distinct class so `_init_weights` can give it its bias init."""


class CPLMCopyHead(nn.Module):
    """Copy-head parameters and projections; all copy-head math runs in fp32 whatever the model dtype."""

    def __init__(self, config: CPLMConfig) -> None:
        super().__init__()
        self.num_heads = config.copy_heads
        self.head_dim = config.copy_head_dim
        width = config.copy_heads * config.copy_head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=False)
        if config.copy_qk_norm:
            self.q_norm = LlamaRMSNorm(config.copy_head_dim, eps=config.copy_norm_eps)
            self.k_norm = LlamaRMSNorm(config.copy_head_dim, eps=config.copy_norm_eps)
        else:
            self.q_norm = None
            self.k_norm = None
        self.mixing = config.copy_mixing
        self.rule = mixing_rule(config.copy_mixing)
        self.gate = CopyGate(config.hidden_size, self.rule.gate_rows(config.copy_heads), bias=True)

    def _project(self, linear: nn.Linear, norm: nn.Module | None, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape
        heads = F.linear(hidden.float(), linear.weight.float()).view(batch, length, self.num_heads, self.head_dim)
        if norm is not None:
            heads = norm(heads)  # fp32 in -> fp32 out (weight promotes to fp32)
        return heads.transpose(1, 2)

    def queries(self, hidden: torch.Tensor) -> torch.Tensor:
        """Copy queries `[b, H_c, n, d_c]` (fp32) of final-normed hidden states `[b, n, hidden]`."""
        return self._project(self.q_proj, self.q_norm, hidden)

    def keys(self, hidden: torch.Tensor) -> torch.Tensor:
        """Copy keys `[b, H_c, n, d_c]` (fp32) of final-normed hidden states `[b, n, hidden]`."""
        return self._project(self.k_proj, self.k_norm, hidden)

    def gate_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logit of the copy weight g per position, `[b, n]` (fp32), for rules with one (gate, constant)."""
        if self.rule.gate_logit is None:
            raise ValueError(f"copy_mixing={self.mixing!r} has no single gate logit (it reads the copy statistics): "
                             "use CPLMCopyHead.mixture_weights")
        return self.rule.gate_logit(hidden.float(), self.gate.weight.float(), self.gate.bias.float())

    def mixture_weights(self, hidden: torch.Tensor, has_candidate: torch.Tensor,
                        lse: torch.Tensor | None = None) -> MixtureWeights:
        """log g, log(1 - g) `[b, n]` (fp32) under the configured rule; `lse` `[b, n, H_c]` is the candidates'
        log-sum-exp per copy head (`copy_log_probs(..., return_lse=True)`), read by rules such as `sentinel`."""
        stats = CopyStats(lse) if lse is not None else None
        return self.rule.weights(hidden.float(), self.gate.weight.float(), self.gate.bias.float(), has_candidate,
                                 stats)


def candidate_labels(token_ids: torch.Tensor) -> torch.Tensor:
    """Label `y_j = x_{j+1}` proposed by each position `[b, L]`; the last position (no label yet) gets 0."""
    return F.pad(token_ids[:, 1:], (0, 1), value=0)


def document_ids(token_ids: torch.Tensor, valid: torch.Tensor, eod_token_id: int | None) -> torch.Tensor | None:
    """Document index `[b, L]` of each position: the number of real EOD tokens before it (an EOD belongs
    to the document it ends); None without an EOD id (one document per row)."""
    if eod_token_id is None:
        return None
    is_eod = ((token_ids == eod_token_id) & valid).long()
    return torch.cumsum(is_eod, dim=1) - is_eod


def candidate_mask(
    valid: torch.Tensor, query_positions: torch.Tensor, documents: torch.Tensor | None = None
) -> torch.Tensor:
    """Bool `[b, nq, L]`: j is a candidate for query t iff j < t, positions j, j+1 are real tokens and
    (with `documents` `[b, L]`) j and t are in the same document."""
    labelled = F.pad(valid[:, :-1] & valid[:, 1:], (0, 1), value=False)
    query_positions = query_positions.to(valid.device)
    key_positions = torch.arange(valid.shape[1], device=valid.device)
    earlier = key_positions[None, :] < query_positions[:, None]
    mask = labelled[:, None, :] & earlier[None, :, :]
    if documents is not None:
        mask = mask & (documents[:, query_positions, None] == documents[:, None, :])
    return mask


def copy_log_probs(
    queries: torch.Tensor,
    keys: torch.Tensor,
    labels: torch.Tensor,
    candidates: torch.Tensor,
    vocab_size: int,
    return_lse: bool = False,
) -> tuple[torch.Tensor, ...]:
    """log p_copy `[b, nq, V]` (-inf where no copy mass) and has-candidate `[b, nq]` (and with `return_lse`
    the candidates' log-sum-exp per copy head `[b, nq, H]`, meaningful where t has a candidate).

    queries `[b, H, nq, d]`, keys `[b, H, L, d]` (fp32), labels `[b, L]`, candidates `[b, nq, L]`.
    p_copy(v|t) = mean over heads of the softmax-over-candidates mass on candidates with label v.
    """
    scores = torch.matmul(queries, keys.transpose(-1, -2)) / math.sqrt(queries.shape[-1])
    has_candidate = candidates.any(dim=-1)
    scores = scores.masked_fill(~candidates[:, None], float("-inf"))
    # Rows without candidates would be all -inf (NaN softmax, NaN grads): give them zeros, then drop them.
    scores = torch.where(has_candidate[:, None, :, None], scores, torch.zeros_like(scores))
    lse = torch.logsumexp(scores, dim=-1).transpose(1, 2) if return_lse else None
    weights = torch.softmax(scores, dim=-1) * candidates[:, None].to(scores.dtype)
    mean_weights = weights.mean(dim=1)  # [b, nq, L]
    index = labels[:, None, :].expand_as(mean_weights)
    p_copy = mean_weights.new_zeros(*mean_weights.shape[:2], vocab_size).scatter_add_(-1, index, mean_weights)
    has_mass = p_copy > 0
    safe_log = torch.log(torch.where(has_mass, p_copy, torch.ones_like(p_copy)))
    log_p_copy = torch.where(has_mass, safe_log, torch.full_like(p_copy, float("-inf")))
    return (log_p_copy, has_candidate, lse) if return_lse else (log_p_copy, has_candidate)


def mixture_log_probs(
    lm_logits: torch.Tensor,
    gate: torch.Tensor | MixtureWeights,
    log_p_copy: torch.Tensor,
    has_candidate: torch.Tensor,
) -> torch.Tensor:
    """log((1-g) p_LM + g p_copy) `[b, nq, V]` in fp32 (mixing.py), with g = 0 exactly where t has no candidate;
    `gate`: the gate logits `[b, nq]` or the rule's `MixtureWeights` (`CPLMCopyHead.mixture_weights`)."""
    log_p_lm = torch.log_softmax(lm_logits.float(), dim=-1)
    weights = gate if isinstance(gate, MixtureWeights) else mixture_weights(gate, has_candidate)
    return mix_log_probs(weights, log_p_lm, log_p_copy)


def mixture_nll(log_probs: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | None = None) -> torch.Tensor:
    """Mean NLL of shifted `labels` (HF convention: labels = input_ids, -100 ignored) under `log_probs`."""
    targets = labels[:, 1:].to(log_probs.device)
    keep = targets != -100
    picked = log_probs[:, :-1].gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
    total = torch.where(keep, -picked, torch.zeros_like(picked)).sum()
    count = num_items_in_batch if num_items_in_batch is not None else keep.sum().clamp_min(1)
    return total / count


def _kept_positions(logits_to_keep: int | torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
    """Local indices of the positions whose log-probs are returned (HF `logits_to_keep` semantics)."""
    if isinstance(logits_to_keep, int):
        start = length - logits_to_keep if 0 < logits_to_keep <= length else 0
        return torch.arange(start, length, device=device)
    if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dim() == 1:
        return logits_to_keep.to(device=device, dtype=torch.long)
    raise ValueError(
        f"CPLMForCausalLM: logits_to_keep must be an int or a 1-D index tensor, got {type(logits_to_keep).__name__}"
        f"{'' if not isinstance(logits_to_keep, torch.Tensor) else ' of shape ' + str(tuple(logits_to_keep.shape))}"
    )


def _pop_cache(kwargs: dict):
    """The KV cache passed under either name (`cache` in transformers >= 5.2x, else `past_key_values`)."""
    given = {name: kwargs.pop(name) for name in _CACHE_NAMES if kwargs.get(name) is not None}
    for name in _CACHE_NAMES:
        kwargs.pop(name, None)
    if len(given) > 1:
        raise ValueError("CPLMForCausalLM: pass the KV cache as either `cache` or `past_key_values`, not both")
    cache = next(iter(given.values()), None)
    if cache is not None and not hasattr(cache, "get_seq_length"):
        raise ValueError(
            f"CPLMForCausalLM: the KV cache must be a transformers Cache (e.g. DynamicCache), got {type(cache).__name__}"
        )
    if cache is not None and getattr(cache, "is_compileable", False):
        raise ValueError(
            f"CPLMForCausalLM supports only dynamic KV caches (got {type(cache).__name__}); "
            "do not set cache_implementation='static' for this model"
        )
    return cache


def _copy_state_before(cache, batch_size: int) -> CopyKeyState | None:
    """The copy-key state matching the cache's current length (None when the cache is empty or absent)."""
    if cache is None:
        return None
    cached_len = cache.get_seq_length()
    state = getattr(cache, COPY_STATE_ATTR, None)
    if state is None:
        if cached_len == 0:
            return None
        raise ValueError(
            f"CPLMForCausalLM: the KV cache holds {cached_len} positions but no copy-key state "
            f"(`{COPY_STATE_ATTR}`): it was filled by another model or outside CPLMForCausalLM.forward; "
            "start from an empty cache"
        )
    if state.length < cached_len:
        raise ValueError(
            f"CPLMForCausalLM: the copy-key state covers {state.length} positions but the KV cache holds "
            f"{cached_len}; the cache was extended outside CPLMForCausalLM.forward"
        )
    if state.batch_size != batch_size:
        raise ValueError(
            f"CPLMForCausalLM: the cached copy-key state has batch size {state.batch_size} but input_ids has "
            f"{batch_size}; batch-changing cache operations other than beam reordering are not supported"
        )
    if cached_len == 0:
        return None
    return state if state.length == cached_len else state.cropped(cached_len)


def _validity_mask(attention_mask: torch.Tensor | None, batch_size: int, total_len: int, device) -> torch.Tensor:
    """Bool `[b, past + new]`: which positions are real tokens (all of them without a mask)."""
    if attention_mask is None:
        return torch.ones(batch_size, total_len, dtype=torch.bool, device=device)
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch_size, total_len):
        raise ValueError(
            "CPLMForCausalLM needs a 2-D padding attention_mask of shape [batch, cached + new positions] = "
            f"{[batch_size, total_len]}, got shape {list(attention_mask.shape)}"
        )
    return attention_mask.to(device=device).bool()


class CPLMForCausalLM(LlamaForCausalLM):
    """Causal LM whose output distribution mixes the LM head with the Copy-Paste head; the decoder is
    ``config.cplm_backbone``'s (``decoder_class``; the Llama one by default)."""

    config_class = CPLMConfig
    _supports_static_cache = False  # the copy-key state lives beside a dynamic cache only
    _can_compile_fullgraph = False

    def __init__(self, config: CPLMConfig) -> None:
        # Build the modules here (not via LlamaForCausalLM.__init__) so post_init runs once, with the head.
        LlamaPreTrainedModel.__init__(self, config)
        decoder = decoder_class(getattr(config, "cplm_backbone", "llama"))
        self.model = decoder(config)
        self._no_split_modules = list(getattr(decoder, "_no_split_modules", None) or [])
        self._cache_kwarg = _cache_kwarg(decoder)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.copy_head = CPLMCopyHead(config)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, CopyGate):
            # torch.nn.init is guarded by transformers during from_pretrained: loaded values are kept.
            nn.init.constant_(module.bias, self.config.copy_gate_bias_init)

    def _reorder_cache(self, cache, beam_idx: torch.Tensor):
        """Beam search: reorder the KV cache and the copy-key state alike."""
        cache.reorder_cache(beam_idx)
        state = getattr(cache, COPY_STATE_ATTR, None)
        if state is not None:
            setattr(cache, COPY_STATE_ATTR, state.select_batch(beam_idx))
        return cache

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """Mixture log-probs `[b, kept positions, V]` as `logits`; `loss` = mean mixture NLL of `labels`."""
        if input_ids is None or inputs_embeds is not None:
            raise ValueError(
                "CPLMForCausalLM needs input_ids and no inputs_embeds: copy candidates propose the tokens "
                "that followed earlier positions"
            )
        if labels is not None and not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
            raise ValueError("CPLMForCausalLM: labels need the log-probs of all positions (logits_to_keep=0)")
        cache = _pop_cache(kwargs)
        return_dict = kwargs.pop("return_dict", None)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        batch_size, new_len = input_ids.shape

        past = _copy_state_before(cache, batch_size)
        past_len = 0 if past is None else past.length
        valid = _validity_mask(attention_mask, batch_size, past_len + new_len, input_ids.device)

        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **{self._cache_kwarg: cache},
            **kwargs,
        )
        hidden = outputs.last_hidden_state  # final-normed, [b, n, hidden]
        keys = self.copy_head.keys(hidden)
        token_ids = input_ids
        if past is not None:
            keys = torch.cat([past.keys.to(keys.device), keys], dim=2)
            token_ids = torch.cat([past.token_ids.to(input_ids.device), input_ids], dim=1)
        returned_cache = getattr(outputs, _OUTPUT_CACHE_FIELD, None)
        if returned_cache is not None and returned_cache.get_seq_length() == past_len + new_len:
            setattr(returned_cache, COPY_STATE_ATTR, CopyKeyState(keys, token_ids))

        kept = _kept_positions(logits_to_keep, new_len, hidden.device)
        hidden_kept = hidden[:, kept]
        eod = self.config.copy_eod_token_id if self.config.copy_reset_at_eod else None
        log_p_copy, has_candidate, lse = copy_log_probs(
            self.copy_head.queries(hidden_kept),
            keys,
            candidate_labels(token_ids),
            candidate_mask(valid, past_len + kept, document_ids(token_ids, valid, eod)),
            self.config.vocab_size,
            return_lse=True,
        )
        weights = self.copy_head.mixture_weights(hidden_kept, has_candidate, lse)
        log_probs = mixture_log_probs(self.lm_head(hidden_kept), weights, log_p_copy, has_candidate)
        loss = None if labels is None else mixture_nll(log_probs, labels, num_items_in_batch)
        result = CausalLMOutputWithPast(
            loss=loss,
            logits=log_probs,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{_OUTPUT_CACHE_FIELD: returned_cache},
        )
        return result.to_tuple() if return_dict is False else result
