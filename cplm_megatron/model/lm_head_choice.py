"""`model.lm_head_loss: auto`: Megatron's logits where they are cheap, a tiled loss where they are not.

Megatron's path (a ``[tokens, V/tp]`` logits tensor and its fp32 copy) is the fastest: on an H200 the chunked loss
took 3.96x and the fused one 2.2x its time at hidden 576, seq 2048 (1.43x and ~1.1x of a SmolLM2-135M training
step). The tiled losses pay that time to save the logits' memory, which is worth it only where the memory is
scarce. The rule: Megatron's path, unless its logits' working memory (the planner's estimate,
`accounting.lm_head_loss_bytes`) would exceed `AUTO_LOGITS_SHARE` of the device's memory, or the whole run would not
fit with them but would without; then the tiled loss: `fused` (Triton) on CUDA, `chunked` elsewhere. "Fits" keeps a
reserve: the planner's estimate times the margin measured on a GPU within the device's memory less
`planner.DEVICE_RESERVE` (a run estimated at 78.99 GiB does not "fit" an H100's 79.6). Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from cplm_megatron.model.config import ModelConfig
from cplm_megatron.model.sizing.accounting import GIB, lm_head_loss_bytes
from cplm_megatron.model.sizing.planner import DEVICE_RESERVE, PEAK_MARGIN

AUTO_LOGITS_SHARE = 0.25  # Megatron's logits may take up to this share of the device's memory


@dataclass(frozen=True)
class LossChoice:
    """The LM-head loss path `auto` resolved to, and why (one line for the console and the run record)."""

    path: str
    reason: str


def choose_lm_head_loss(model: ModelConfig, tokens: int, tp: int, param_bytes: int, device_bytes: float,
                        device: str, on_cuda: bool, fits: Optional[Callable[[str], bool]] = None,
                        needed: Optional[Callable[[str], float]] = None) -> LossChoice:
    """Resolve `auto` for a micro-batch of `tokens` per GPU of the last stage on a device of `device_bytes`
    (`device` names it). Whether the whole run fits with a loss path: `needed(path)`, the planner's bytes, checked
    with the reserve (`run_fits`), or `fits(path)` as the caller decides it (None: not checked)."""
    if needed is not None:
        fits = lambda path: run_fits(needed(path), device_bytes)  # noqa: E731
    tiled = "fused" if on_cuda else "chunked"
    logits = lm_head_loss_bytes(model, tokens, tp, "megatron", param_bytes)["peak"]
    share = logits / device_bytes
    figures = (f"Megatron's logits take {logits / GIB:.2f} GiB, {100 * share:.1f}% of {device} "
               f"(auto keeps them up to {100 * AUTO_LOGITS_SHARE:.0f}%)")
    if share > AUTO_LOGITS_SHARE:
        return LossChoice(tiled, f"{figures}: the tiled loss instead")
    if fits is not None and not fits("megatron") and fits(tiled):
        return LossChoice(tiled, f"{figures}, but the run fits only without them: the tiled loss")
    return LossChoice("megatron", figures)


def run_fits(needed_bytes: float, device_bytes: float) -> bool:
    """Whether a run the planner estimates at `needed_bytes` fits a device of `device_bytes`: the estimate times the
    measured margin within the memory less the reserve."""
    return needed_bytes * PEAK_MARGIN <= device_bytes * (1 - DEVICE_RESERVE)
