"""The Copy-Paste mixing rule, in one place: p(v|t) = (1 - g_t) p_LM(v|t) + g_t p_copy(v|t).

A *variant* decides the copy weight g_t from the final hidden state h_t, the gate's parameters
(w_g [rows, d], b_g [rows]) and the copy head's statistics at t (`CopyStats`: per copy head c the
log-sum-exp lse^c_t of its scores over the candidates C(t)):

* ``gate`` (default): g_t = sigmoid(w_g . h_t + b_g), a learned gate per position;
* ``constant``: g_t = sigmoid(b_g), one learned number (w_g stays frozen at zero);
* ``sentinel``: a pointer sentinel per copy head, sigma^c_t = w^c . h_t + b^c (rows = H_c), competing
  with the head's candidates in one softmax: g_t = mean_c exp(lse^c_t) / (exp(lse^c_t) + exp(sigma^c_t))
  = mean_c sigmoid(lse^c_t - sigma^c_t), so the copy weight rises with the copy evidence.

Where t has no copy candidate, g_t = 0 exactly whatever the variant. The training loss
(``copy_head.py``), the vocab-parallel full distribution (``cplm_gpt.py`` through
``CopyPasteHead.mixture_log_probs``) and the exported Hugging Face model (this file is shipped as
``mixing.py`` next to ``modeling_cplm.py``) all call `MixingRule.weights`.

Adding a variant: write ``def my_logit(hidden, weight, bias) -> logits`` and add
``"my": MixingRule(my_logit)`` to ``MIXING_RULES`` (or, for a rule that reads the copy statistics,
``MixingRule(weights_fn=my_weights, ...)`` with ``my_weights(hidden, weight, bias, stats, has_candidate)
-> MixtureWeights``), and its name to ``MIXING_VARIANTS`` in model/config.py (the check of
``copy_head.mixing`` that imports no torch; a test keeps the two lists equal); ``copy_head.mixing: my``
selects it in training and the HF config's ``copy_mixing`` carries it into exports.

Self-contained on purpose (torch only): exported checkpoint directories load it with
``trust_remote_code=True`` on machines without cplm_megatron.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")

# (hidden [..., d], gate weight [1, d], gate bias [1]) -> the logit z of the copy weight g = sigmoid(z), [...]
GateLogitFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class CopyStats:
    """What the copy head computed at each position that a rule may read (training, the full distribution and
    the HF model fill it alike)."""

    lse: torch.Tensor  # [..., H_c]: per copy head c, logsumexp of its scaled scores over C(t) (-inf: no candidate)


@dataclass
class MixtureWeights:
    """log g_t and log(1 - g_t) per position, with g_t = 0 exactly where t has no copy candidate."""

    log_copy: torch.Tensor  # log g_t (-inf without a candidate)
    log_lm: torch.Tensor  # log(1 - g_t) (0 without a candidate)

    @property
    def gate(self) -> torch.Tensor:
        """g_t itself (exactly 0 without a candidate)."""
        return self.log_copy.exp()


# (hidden [..., d], gate weight [rows, d], gate bias [rows], copy statistics, has_candidate [...]) -> weights
WeightsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Optional[CopyStats], torch.Tensor], MixtureWeights]


def _one_row(copy_heads: int) -> int:
    return 1


def _row_per_head(copy_heads: int) -> int:
    return copy_heads


@dataclass(frozen=True)
class MixingRule:
    """One variant: the copy weight's logit (`gate_logit`, g = sigmoid(logit)), or the mixture weights
    themselves from the copy statistics (`weights_fn`)."""

    gate_logit: Optional[GateLogitFn] = None
    # False: the rule ignores w_g, so training zeroes and freezes it (a parameter that never receives a
    # gradient would stall Megatron's overlapped gradient reduction).
    uses_gate_weight: bool = True
    weights_fn: Optional[WeightsFn] = None
    gate_rows_fn: Callable[[int], int] = _one_row  # rows of w_g / b_g given the number of copy heads H_c

    def __post_init__(self) -> None:
        if (self.gate_logit is None) == (self.weights_fn is None):
            raise ValueError("a MixingRule needs exactly one of gate_logit and weights_fn")

    @property
    def uses_copy_stats(self) -> bool:
        """Whether `weights` reads the copy statistics (callers compute them only then)."""
        return self.weights_fn is not None

    def gate_rows(self, copy_heads: int) -> int:
        """Output rows of the gate's Linear(d, rows) for a head with `copy_heads` copy heads."""
        return self.gate_rows_fn(copy_heads)

    def weights(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, has_candidate: torch.Tensor,
                stats: Optional[CopyStats] = None) -> MixtureWeights:
        """The mixture weights at every position of `hidden` [..., d] (computed in at least fp32)."""
        if self.weights_fn is not None:
            if stats is None:
                raise ValueError("this mixing rule reads the copy statistics (CopyStats): pass stats")
            return self.weights_fn(hidden, weight, bias, stats, has_candidate)
        return mixture_weights(_fp32(self.gate_logit(hidden, weight, bias)), has_candidate)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def _per_position_gate(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.linear(hidden, weight, bias).squeeze(-1)


def _constant_gate(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return bias[0].expand(hidden.shape[:-1])


def _sentinel_weights(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stats: CopyStats,
                      has_candidate: torch.Tensor) -> MixtureWeights:
    """g = mean_c sigmoid(lse^c - sigma^c), sigma^c = w^c . h + b^c; log g and log(1 - g) = log mean_c
    sigmoid(sigma^c - lse^c) as log-sum-exps of log-sigmoids (no cancellation where g is near 0 or 1)."""
    sigma = _fp32(F.linear(hidden, weight, bias))  # [..., H_c]
    lse = _fp32(stats.lse)
    if lse.shape != sigma.shape:
        raise ValueError(f"sentinel mixing: copy statistics lse {tuple(lse.shape)} do not match the sentinel "
                         f"logits {tuple(sigma.shape)} ([..., copy heads])")
    # rows without candidates have lse = -inf: use 0 there (finite values and zero gradients), dropped below
    z = torch.where(has_candidate[..., None], lse, 0.0) - sigma
    log_heads = math.log(z.shape[-1])
    log_copy = torch.logsumexp(F.logsigmoid(z), dim=-1) - log_heads
    log_lm = torch.logsumexp(F.logsigmoid(-z), dim=-1) - log_heads
    return MixtureWeights(torch.where(has_candidate, log_copy, NEG_INF), torch.where(has_candidate, log_lm, 0.0))


MIXING_RULES: Dict[str, MixingRule] = {
    "gate": MixingRule(_per_position_gate),
    "constant": MixingRule(_constant_gate, uses_gate_weight=False),
    "sentinel": MixingRule(weights_fn=_sentinel_weights, gate_rows_fn=_row_per_head),
}


def mixing_rule(name: str) -> MixingRule:
    """The registered variant `name`; a ValueError naming the choices otherwise."""
    if name not in MIXING_RULES:
        raise ValueError(f"unknown copy-head mixing {name!r}; choose one of {sorted(MIXING_RULES)}")
    return MIXING_RULES[name]


def mixture_weights(logit: torch.Tensor, has_candidate: torch.Tensor) -> MixtureWeights:
    """The mixture weights of gate logits `logit` (any shape; computed in at least fp32)."""
    logit = logit if logit.dtype == torch.float64 else logit.float()
    return MixtureWeights(
        torch.where(has_candidate, F.logsigmoid(logit), NEG_INF),
        torch.where(has_candidate, F.logsigmoid(-logit), 0.0),
    )


def mix_log_probs(weights: MixtureWeights, log_p_lm: torch.Tensor, log_p_copy: torch.Tensor) -> torch.Tensor:
    """log((1 - g) p_LM + g p_copy): per target (`log_p_*` shaped like the weights) or per vocabulary
    entry (`log_p_*` with one more, last dimension). `log_p_copy` is -inf where no candidate proposes it."""
    log_copy, log_lm = weights.log_copy, weights.log_lm
    if log_p_lm.dim() == log_lm.dim() + 1:
        log_copy, log_lm = log_copy[..., None], log_lm[..., None]
    return torch.logaddexp(log_lm + log_p_lm, log_copy + log_p_copy)
