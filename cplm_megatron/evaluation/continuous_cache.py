"""The continuous cache of Grave et al. (2017): a test-time copy mechanism for any trained model.

For position t of a document (predicting y_t = x_{t+1}) the cache holds the pairs (h_i, y_i) of the
earlier positions i < t of the same document, h the final (normed) hidden states:

    p_cache(v | t) = sum_{i < t, y_i = v} exp(theta h_t . h_i) / sum_{i < t} exp(theta h_t . h_i)
    p(v | t)       = (1 - lambda) p_model(v | t) + lambda p_cache(v | t)      (p_model alone when i < t is empty)

p_model is the model's own distribution (the LM softmax for a baseline, the mixture for a CPLM).
lambda and theta are chosen on a dev split (`tune`), never on the split that is reported. theta is
searched on a grid relative to 1 / mean ||h||^2 so one grid fits any width and norm gain.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

LAMBDAS: tuple[float, ...] = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
THETA_SCALES: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def cache_target_log_probs(hidden: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, theta: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """log p_cache(y_t | t) [n] (-inf where no earlier entry has label y_t) and has-entry [n] for one document.

    hidden [n, d], labels [n] (y_i = x_{i+1}), valid [n] bool (positions whose label is real: entries
    and scored positions). Computed in float64 on the hidden states' device."""
    h = hidden.double()
    n = h.shape[0]
    labels, valid = labels.to(h.device), valid.to(h.device)
    scores = theta * (h @ h.T)  # [t, i]
    earlier = torch.ones(n, n, dtype=torch.bool, device=h.device).tril(-1) & valid[None, :]
    has = earlier.any(dim=1)
    scores = scores.masked_fill(~earlier, float("-inf"))
    scores = torch.where(has[:, None], scores, torch.zeros_like(scores))
    log_norm = torch.logsumexp(scores, dim=1)
    same = earlier & (labels[None, :] == labels[:, None])
    match = torch.logsumexp(scores.masked_fill(~same, float("-inf")), dim=1)
    return torch.where(has, match - log_norm, torch.full_like(match, float("-inf"))), has


def mix_target_log_probs(model_lp: torch.Tensor, cache_lp: torch.Tensor, has: torch.Tensor, lam: float
                         ) -> torch.Tensor:
    """log((1 - lambda) p_model(y) + lambda p_cache(y)), p_model alone without cache entries (float64)."""
    model_lp = model_lp.double()
    if lam <= 0.0:
        return model_lp
    mixed = torch.logaddexp(math.log1p(-lam) + model_lp, math.log(lam) + cache_lp)
    return torch.where(has, mixed, model_lp)


@dataclass
class CacheInputs:
    """Per scored position of a split: the model's log p(y), the document, and the cache's log p(y) per theta."""

    model_lp: torch.Tensor  # [N] float64
    documents: torch.Tensor  # [N] global document numbers
    cache_lp: dict[float, torch.Tensor]  # theta -> [N] float64 (-inf: no entry with the label)
    has: torch.Tensor  # [N] bool: the document had earlier positions


def collect(segments: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
            thetas: Sequence[float]) -> CacheInputs:
    """From (hidden [n, d], labels [n], valid [n], model log p(y) [n], documents [n]) per document segment (the
    cache on the hidden states' device; the results on the CPU)."""
    model, docs, has_all = [], [], []
    cache: dict[float, list[torch.Tensor]] = {t: [] for t in thetas}
    for hidden, labels, valid, model_lp, documents in segments:
        for theta in thetas:
            lp, has = cache_target_log_probs(hidden, labels, valid, theta)
            cache[theta].append(lp.cpu()[valid])
            has = has.cpu()
        model.append(model_lp.double().cpu()[valid])
        docs.append(documents[valid])
        has_all.append(has[valid])
    cat = (lambda xs: torch.cat(xs) if xs else torch.empty(0))  # noqa: E731
    return CacheInputs(cat(model), cat(docs), {t: cat(v) for t, v in cache.items()}, cat(has_all).bool())


def tune(inputs: CacheInputs, lambdas: Sequence[float] = LAMBDAS) -> tuple[float, float, float]:
    """(lambda, theta, mean NLL) minimizing the mean NLL of `inputs` over the lambda x theta grid."""
    best = (0.0, next(iter(inputs.cache_lp)), float(-inputs.model_lp.mean()))
    for theta, cache_lp in inputs.cache_lp.items():
        for lam in lambdas:
            loss = float(-mix_target_log_probs(inputs.model_lp, cache_lp, inputs.has, lam).mean())
            if loss < best[2] - 1e-12:
                best = (lam, theta, loss)
    return best


def theta_grid(mean_sq_norm: float, scales: Sequence[float] = THETA_SCALES) -> tuple[float, ...]:
    """theta candidates c / mean ||h||^2 (so theta h_t . h_i is c times a cosine for equal-norm states)."""
    return tuple(c / max(mean_sq_norm, 1e-12) for c in scales)


def cache_argmax_correct(hidden: torch.Tensor, log_probs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor,
                         theta: float, lam: float) -> torch.Tensor:
    """Bool [n]: whether the argmax of (1 - lambda) p_model + lambda p_cache is the label y_t, for one document
    (hidden [n, d], the model's log-probs [n, V], labels [n], valid [n]; p_model alone without earlier entries).

    p_cache puts its mass on earlier labels only, so the mixture's maximum is at one of them or at the model's
    argmax: both are compared (float64, on the hidden states' device)."""
    h = hidden.double()
    n, device = h.shape[0], h.device
    labels, valid = labels.to(device).long(), valid.to(device)
    p_model = log_probs.to(device).double().exp()
    earlier = torch.ones(n, n, dtype=torch.bool, device=device).tril(-1) & valid[None, :]
    has = earlier.any(dim=1)
    scores = (theta * (h @ h.T)).masked_fill(~earlier, float("-inf"))
    weights = torch.where(has[:, None], torch.softmax(torch.where(has[:, None], scores, 0.0), dim=1), 0.0)
    same = (labels[:, None] == labels[None, :]).double()  # [i, j]: y_i == y_j
    lam = lam if lam > 0 else 0.0
    at_earlier = (1 - lam) * p_model.gather(1, labels[None, :].expand(n, n)) + lam * (weights @ same)  # [t, j]
    best = torch.maximum(at_earlier.masked_fill(~earlier, float("-inf")).amax(dim=1),
                         (1 - lam) * p_model.amax(dim=1))
    at_label = (1 - lam) * p_model.gather(1, labels[:, None]).squeeze(1) + lam * (weights * same).sum(dim=1)
    return at_label >= best * (1 - 1e-12)
