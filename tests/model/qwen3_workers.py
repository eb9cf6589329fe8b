"""Worker of the Qwen3 layout test (spawned processes): one train step of `tiny-qwen3` with the copy head, and the
gradients of its q/k norms (replicated over TP: megatron-core must sum each rank's share of the heads)."""
from __future__ import annotations

from typing import Dict

from tests.parallel.layouts import one_step


def step_with_qk_norm_grads(rank: int, parallel_kw: dict, init_dir: str, copy_kw: dict, save_init: bool) -> Dict:
    """tests/parallel/layouts.one_step on tiny-qwen3, plus {param name: main_grad} of every q/k layernorm."""
    import torch

    from cplm_megatron.training import step as step_module

    grads: Dict[str, torch.Tensor] = {}

    real_train_step = step_module.train_step

    def train_step_keeping_grads(chunks, *args, **kwargs):
        result = real_train_step(chunks, *args, **kwargs)
        for chunk in chunks:
            for name, p in chunk.module.named_parameters():
                if "q_layernorm" in name or "k_layernorm" in name:
                    grads[name] = p.main_grad.detach().clone()
        return result

    step_module.train_step = train_step_keeping_grads
    try:
        out = one_step(rank, parallel_kw, init_dir, None, copy_kw, 4, save_init, preset="tiny-qwen3")
    finally:
        step_module.train_step = real_train_step
    return {**out, "qk_norm_grads": grads}
