"""The Copy-Paste head: copy distribution over earlier labels, gated mixture with the LM head.

Contract: docs/design.md ("The Copy-Paste head"). Training never builds a vocabulary-sized copy tensor:
``log p_LM(y_t) = -CE_t`` comes from Megatron's vocab-parallel cross entropy and
``log p_copy(y_t)`` from two log-sum-exps over candidates (cplm_kernels). The parameters are
replicated on every TP rank; the head sees full (sequence-gathered) hidden states, so its gradients
are identical across TP ranks and need no reduction.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

import cplm_kernels
from cplm_kernels.configs import SUPPORTED_HEAD_DIMS
from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import CopyHeadConfig  # noqa: F401 - re-exported: its home is model/config.py
from cplm_megatron.model.mixing import CopyStats, MixtureWeights, mix_log_probs, mixing_rule
from cplm_megatron.parallel.context import gather_sequence, max_over_cp, this_rank_positions

NEG_INF = float("-inf")
log = logging.getLogger(__name__)


LseFn = Callable[..., Tuple[torch.Tensor, torch.Tensor]]


def resolve_impl(cfg: CopyHeadConfig, device: torch.device) -> str:
    """`auto` -> fused on CUDA when the Triton kernel is importable, else chunked; the kernel's needs (triton, a
    device, a head dim it supports) are checked here, where the head is built, not when the config loads."""
    if cfg.impl != "auto":
        if cfg.impl == "fused" and not _fused_available():
            raise ConfigError(
                "copy_head.impl=fused needs triton and a CUDA device (or TRITON_INTERPRET=1); "
                "use copy_head.impl=chunked on CPU"
            )
        impl = cfg.impl
    else:
        impl = "fused" if device.type == "cuda" and _fused_available() else "chunked"
    if impl == "fused" and cfg.head_dim not in SUPPORTED_HEAD_DIMS:
        via = "copy_head.impl=fused" if cfg.impl == "fused" else "copy_head.impl=auto picks it on this CUDA machine"
        raise ConfigError(
            f"copy_head.head_dim={cfg.head_dim}: the fused copy kernel ({via}) supports head_dim "
            f"{'/'.join(map(str, SUPPORTED_HEAD_DIMS))}; choose one of them or set copy_head.impl=chunked"
        )
    return impl


def _fused_available() -> bool:
    probe = getattr(cplm_kernels, "fused_available", None)
    return bool(probe and probe())


def _fp32(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (fp64 stays fp64, for exact reference checks)."""
    return x if x.dtype == torch.float64 else x.float()


def safe_logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """logsumexp that returns -inf for all -inf rows with zero (not NaN) gradients."""
    any_finite = torch.isfinite(x).any(dim, keepdim=True)
    out = torch.logsumexp(torch.where(any_finite, x, 0.0), dim=dim, keepdim=True)
    return torch.where(any_finite, out, NEG_INF).squeeze(dim)


def candidate_labels(labels: torch.Tensor, loss_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Labels as copy candidates: ignored (<0) or loss-masked positions become -1 (never candidates)."""
    valid = labels >= 0
    if loss_mask is not None:
        valid = valid & (loss_mask > 0)
    return torch.where(valid, labels, -1)


@dataclass
class CopyHeadOutput:
    """Per-token results, all [b, s]."""

    loss: torch.Tensor  # mixture NLL (+ auxiliary terms)
    lm_ce: torch.Tensor  # -log p_LM(y_t)
    mix_nll: torch.Tensor  # -log p(y_t) of the mixture
    gate: torch.Tensor  # g_t (0 where no candidate)
    has_candidate: torch.Tensor  # bool
    has_match: torch.Tensor  # bool: some candidate proposes y_t
    log_p_copy: torch.Tensor  # log p_copy(y_t) (-inf without a match)

    # what metrics() returns, in order (the step reduces them by these names, on every pipeline stage)
    METRICS = ("lm_loss", "mix_loss", "gate_mean", "match_frac", "copy_prob")

    def metrics(self) -> Dict[str, torch.Tensor]:
        """Detached per-token tensors the loss function reduces with the loss mask (names: METRICS)."""
        return {
            "lm_loss": self.lm_ce.detach(),
            "mix_loss": self.mix_nll.detach(),
            "gate_mean": self.gate.detach(),
            "match_frac": self.has_match.detach().float(),
            "copy_prob": self.log_p_copy.detach().exp(),
        }


class CopyPasteHead(nn.Module):
    """q/k projections (+ optional per-head RMSNorm) and the gate (Linear(d, 1), or Linear(d, H_c) for the
    sentinel rule); replicated across TP ranks."""

    def __init__(self, hidden_size: int, cfg: CopyHeadConfig, init_std: float = 0.02,
                 params_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg = cfg
        self.rule = mixing_rule(cfg.mixing)
        inner = cfg.heads * cfg.head_dim
        self.q_proj = nn.Linear(hidden_size, inner, bias=False, dtype=params_dtype)
        self.k_proj = nn.Linear(hidden_size, inner, bias=False, dtype=params_dtype)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps, dtype=params_dtype)
            self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps, dtype=params_dtype)
        self.gate = nn.Linear(hidden_size, self.rule.gate_rows(cfg.heads), bias=True, dtype=params_dtype)
        with torch.no_grad():
            nn.init.normal_(self.q_proj.weight, std=init_std)
            nn.init.normal_(self.k_proj.weight, std=init_std)
            nn.init.normal_(self.gate.weight, std=init_std)
            self.gate.bias.fill_(cfg.gate_bias_init)
            if not self.rule.uses_gate_weight:
                self.gate.weight.zero_()
                self.gate.weight.requires_grad_(False)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self._impl: Optional[Tuple[str, str]] = None  # (device type, implementation) resolved on first use

    def impl_for(self, device: torch.device) -> str:
        """copy_head.impl resolved for `device` (once per device type); says in the log when FP8 cannot apply."""
        if self._impl is None or self._impl[0] != device.type:
            impl = resolve_impl(self.cfg, device)
            if self.cfg.fp8 and impl != "fused":
                log.warning("copy_head.fp8=true is not applied: copy_head.impl=%s runs the %s path on %s, and FP8 "
                            "copy scores exist only in the fused kernel (CUDA + triton)", self.cfg.impl, impl,
                            device.type)
            self._impl = (device.type, impl)
        return self._impl[1]

    def queries_keys(self, hidden: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """[b, s, h] -> q, k as [b, H, s, d]."""
        b, s, _ = hidden.shape
        shape = (b, s, self.cfg.heads, self.cfg.head_dim)
        q = self.q_proj(hidden).view(shape)
        k = self.k_proj(hidden).view(shape)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2)

    def gate_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[b, s, h] -> [b, s] logits of the copy weight (fp32), for rules with one (gate, constant)."""
        if self.rule.gate_logit is None:
            raise ValueError(f"copy_head.mixing={self.cfg.mixing!r} has no single gate logit (it reads the copy "
                             "statistics): use CopyPasteHead.mixture_weights")
        return _fp32(self.rule.gate_logit(hidden, self.gate.weight, self.gate.bias))

    def mixture_weights(self, hidden: torch.Tensor, has_cand: torch.Tensor,
                        lse_all: Optional[torch.Tensor] = None) -> MixtureWeights:
        """log g_t, log(1 - g_t) [b, s] under the configured rule; `lse_all` [b, H, s] are the copy statistics
        (the candidates' log-sum-exp per copy head) a rule such as `sentinel` reads."""
        stats = CopyStats(lse_all.transpose(1, 2)) if lse_all is not None else None
        return self.rule.weights(hidden, self.gate.weight, self.gate.bias, has_cand, stats)

    def copy_lse(self, q, k, cand_labels, doc_ids, impl: str,
                 q_positions: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(lse_all, lse_match) [b, H, s] with the chosen implementation; `q_positions`: the queries' global
        positions under context parallelism (k, cand_labels, doc_ids then cover the whole sequence)."""
        if impl == "naive":
            return cplm_kernels.copy_lse_naive(q, k, cand_labels, doc_ids, self.scale, q_positions=q_positions)
        if impl == "chunked":
            return cplm_kernels.copy_lse_chunked(q, k, cand_labels, doc_ids, self.scale, self.cfg.block_size,
                                                 q_positions=q_positions)
        if impl == "fused":
            if self.cfg.fp8:  # current (amax) scaling inside; straight-through gradients to q, k
                # under CP every rank scales its queries by the whole sequence's amax, as CP=1 does (k is gathered)
                amax = max_over_cp(q.detach().abs().amax().float()) if q_positions is not None else None
                return cplm_kernels.copy_lse_fused_fp8(q, k, cand_labels, doc_ids, self.scale,
                                                       q_positions=q_positions, q_amax=amax)
            return cplm_kernels.copy_lse_fused(q, k, cand_labels, doc_ids, self.scale, q_positions=q_positions)
        raise ConfigError(f"unknown copy_head.impl {impl!r}")

    def forward(
        self,
        hidden: torch.Tensor,
        lm_ce: torch.Tensor,
        labels: torch.Tensor,
        loss_mask: Optional[torch.Tensor] = None,
        doc_ids: Optional[torch.Tensor] = None,
        impl: Optional[str] = None,
    ) -> CopyHeadOutput:
        """Mixture loss per token.

        hidden: final-normed [b, s, h] (full sequence); lm_ce: [b, s] = -log p_LM(y_t);
        labels: [b, s]; loss_mask: [b, s] (0 = padded/ignored, never a candidate); doc_ids: [b, s]
        (candidates stay inside a document) or None (one document per row).
        """
        impl = impl or self.impl_for(hidden.device)
        cand = candidate_labels(labels, loss_mask)
        q, k = self.queries_keys(hidden)
        q_positions = this_rank_positions(hidden.shape[1], hidden.device)
        if q_positions is not None:  # context parallelism: local queries, every rank's keys (docs/design.md)
            k, cand = gather_sequence(k, dim=2), gather_sequence(cand, dim=1)
            doc_ids = gather_sequence(doc_ids, dim=1) if doc_ids is not None else None
        lse_all, lse_match = self.copy_lse(q, k, cand, doc_ids, impl, q_positions)
        has_cand = torch.isfinite(lse_all[:, 0])
        log_p_head = torch.where(has_cand[:, None], lse_match - torch.where(has_cand[:, None], lse_all, 0.0), NEG_INF)
        log_p_copy = safe_logsumexp(log_p_head, dim=1) - math.log(self.cfg.heads)
        has_match = torch.isfinite(log_p_copy)

        weights = self.mixture_weights(hidden, has_cand, lse_all)
        lm_ce = _fp32(lm_ce)
        lm_in_mixture = lm_ce.detach() if self.cfg.decouple_lm else lm_ce
        mix_nll = -mix_log_probs(weights, -lm_in_mixture, log_p_copy)

        loss = mix_nll
        if self.cfg.lm_loss_weight:
            loss = loss + self.cfg.lm_loss_weight * lm_ce
        if self.cfg.copy_loss_weight:
            loss = loss + self.cfg.copy_loss_weight * torch.where(has_match, -log_p_copy, 0.0)
        return CopyHeadOutput(loss, lm_ce, mix_nll, weights.gate, has_cand, has_match, log_p_copy)

    def mixture_log_probs(
        self,
        hidden: torch.Tensor,
        lm_log_probs: torch.Tensor,
        labels: torch.Tensor,
        vocab_start: int,
        loss_mask: Optional[torch.Tensor] = None,
        doc_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """log p(v|t) of the mixture for the vocab slice [vocab_start, vocab_start + V_slice).

        lm_log_probs: [b, s, V_slice] log p_LM normalized over the FULL vocabulary. Copy mass is
        scattered only for candidate labels inside the slice, so summing exp() over all TP slices gives 1.
        """
        if this_rank_positions(hidden.shape[1], hidden.device) is not None:
            raise NotImplementedError("the mixture's full distribution is not implemented under context "
                                      "parallelism; score or export with parallel.cp=1")
        vocab_end = vocab_start + lm_log_probs.shape[-1]
        cand = candidate_labels(labels, loss_mask)
        q, k = self.queries_keys(hidden)
        p_copy, has_cand, lse_all = cplm_kernels.copy_distribution(
            q, k, cand, vocab_start, vocab_end, doc_ids, self.scale, self.cfg.block_size, return_lse=True
        )
        weights = self.mixture_weights(hidden, has_cand, lse_all)
        return mix_log_probs(weights, _fp32(lm_log_probs), torch.log(p_copy))
