"""The Copy-Paste mixing rule, in one place: p(v|t) = (1 - g_t) p_LM(v|t) + g_t p_copy(v|t).

A *variant* decides the copy weight g_t = sigmoid(z_t) by giving its logit z_t from the final hidden
state h_t and the gate's parameters (w_g, b_g):

* ``gate`` (default): z_t = w_g . h_t + b_g, a learned gate per position;
* ``constant``: z_t = b_g, one learned number (w_g stays frozen at zero).

Where t has no copy candidate, g_t = 0 exactly whatever the variant. The training loss
(``copy_head.py``), the vocab-parallel full distribution (``cplm_gpt.py`` through
``CopyPasteHead.mixture_log_probs``) and the exported Hugging Face model (this file is shipped as
``mixing.py`` next to ``modeling_cplm.py``) all call the functions below.

Adding a variant: write ``def my_logit(hidden, weight, bias) -> logits`` and add
``"my": MixingRule(my_logit)`` to ``MIXING_RULES``; ``copy_head.mixing: my`` selects it in
training and the HF config's ``copy_mixing`` carries it into exports.

Self-contained on purpose (torch only): exported checkpoint directories load it with
``trust_remote_code=True`` on machines without cplm_megatron.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")

# (hidden [..., d], gate weight [1, d], gate bias [1]) -> the logit z of the copy weight g = sigmoid(z), [...]
GateLogitFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MixingRule:
    """One variant: how the copy weight's logit is computed."""

    gate_logit: GateLogitFn
    # False: the rule ignores w_g, so training zeroes and freezes it (a parameter that never receives a
    # gradient would stall Megatron's overlapped gradient reduction).
    uses_gate_weight: bool = True


def _per_position_gate(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.linear(hidden, weight, bias).squeeze(-1)


def _constant_gate(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return bias[0].expand(hidden.shape[:-1])


MIXING_RULES: Dict[str, MixingRule] = {
    "gate": MixingRule(_per_position_gate),
    "constant": MixingRule(_constant_gate, uses_gate_weight=False),
}


def mixing_rule(name: str) -> MixingRule:
    """The registered variant `name`; a ValueError naming the choices otherwise."""
    if name not in MIXING_RULES:
        raise ValueError(f"unknown copy-head mixing {name!r}; choose one of {sorted(MIXING_RULES)}")
    return MIXING_RULES[name]


@dataclass
class MixtureWeights:
    """log g_t and log(1 - g_t) per position, with g_t = 0 exactly where t has no copy candidate."""

    log_copy: torch.Tensor  # log g_t (-inf without a candidate)
    log_lm: torch.Tensor  # log(1 - g_t) (0 without a candidate)

    @property
    def gate(self) -> torch.Tensor:
        """g_t itself (exactly 0 without a candidate)."""
        return self.log_copy.exp()


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
