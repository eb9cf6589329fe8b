"""What tools/model_info.py reports for a preset and a layout: parameter counts (analytic, and of the model
built by `build_run` on the meta device), FLOPs per token, a per-GPU memory estimate, whether it fits a GPU
and which layouts of N GPUs do (`--plan`); and the table it prints. The layout is checked as the trainer
checks it (`validate_layout`, `check_context_parallel`: PP x CP is refused with the trainer's error).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Dict, Optional

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.accounting import (
    GIB,
    CopyHeadShape,
    backbone_params,
    copy_head_params,
    lm_head_loss_bytes,
    memory_estimate,
    model_summary,
)
from cplm_megatron.model.config import ModelConfig, load_preset
from cplm_megatron.model.planner import plan_layouts
from cplm_megatron.parallel.config import ParallelConfig

_UNITS = {"": 1e9, "gb": 1e9, "g": 1e9, "gib": 2**30, "mb": 1e6, "mib": 2**20, "tb": 1e12, "tib": 2**40}


def parse_memory(text: str) -> float:
    """'80GB' (decimal, 10^9 bytes: conservative, an "80GB" H100 holds 85.5e9), '80GiB', '141GB' -> GiB;
    ValueError on anything else."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"--gpu-memory {text!r}: expected a size like 80GB, 80GiB or 141GB")
    return float(match.group(1)) * _UNITS[match.group(2).lower()] / GIB


@dataclass
class InfoRequest:
    """A preset, a layout and the run's choices that change memory (the command line's options)."""

    preset: str
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    sp: bool = False
    seq_len: int = 2048
    micro_batch: int = 1
    recompute: str = "none"
    lm_head_loss: str = "megatron"
    attention: str = "sdpa"  # model.attention_impl as resolved: sdpa | te | megatron
    document_masking: bool = False
    offload_fraction: float = 0.0
    gpu_memory: Optional[float] = None  # GiB
    reserve: float = 0.1  # fraction of gpu_memory kept free
    plan: bool = False
    gpus: int = 8
    dtype: str = "bf16"
    no_copy_head: bool = False
    copy_heads: int = 4
    copy_head_dim: int = 64
    copy_qk_norm: bool = False
    model: Optional[ModelConfig] = None  # a recipe's model section (tools/model_info.py --config); None: the preset's

    @property
    def copy(self) -> Optional[CopyHeadShape]:
        return None if self.no_copy_head else CopyHeadShape(self.copy_heads, self.copy_head_dim, self.copy_qk_norm)

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(tp=self.tp, pp=self.pp, sp=self.sp, cp=self.cp)

    def checked_model(self) -> ModelConfig:
        """The preset's model, after the checks the trainer makes of this layout (ConfigError otherwise)."""
        from cplm_megatron.model.layout import check_context_parallel, validate_layout

        if self.plan and self.gpu_memory is None:
            raise ConfigError("--plan needs --gpu-memory (e.g. --gpu-memory 80GB)")
        if not 0.0 <= self.offload_fraction <= 1.0 or not 0.0 <= self.reserve < 1.0:
            raise ConfigError("--offload-fraction must be in [0, 1] and --reserve in [0, 1)")
        model = self.model or load_preset(self.preset)
        validate_layout(self.tp * self.pp * self.cp * self.dp, self.parallel, model)
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise ConfigError(f"--seq-len {self.seq_len} is not divisible by 2 x --cp = {2 * self.cp}")
        check_context_parallel(self.parallel, replace(model, attention_impl=self.attention), self.seq_len)
        return model


def count_built_params(model: ModelConfig, copy: Optional[CopyHeadShape]) -> Dict[str, int]:
    """Build the full model (TP=PP=1, `build_run`) on the meta device and count its parameters."""
    import torch

    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.copy_head import CopyHeadConfig
    from cplm_megatron.model.layout import single_process_megatron

    head = CopyHeadConfig(enabled=copy is not None, **({} if copy is None else
                          dict(heads=copy.heads, head_dim=copy.head_dim, qk_norm=copy.qk_norm)))
    with single_process_megatron(model), torch.device("meta"):
        chunk = build_run(model_run(model, head)).model
    head_params = sum(p.numel() for n, p in chunk.named_parameters() if n.startswith("copy_head."))
    total = sum(p.numel() for p in chunk.parameters())
    return {"backbone": total - head_params, "copy_head": head_params, "total": total}


def report(request: InfoRequest) -> Dict[str, object]:
    """Everything model_info prints, as a dict (checks the layout first, as the trainer would)."""
    r = request
    model, copy = r.checked_model(), r.copy
    summary = model_summary(model, copy, r.seq_len)
    built = count_built_params(model, copy)
    if built["backbone"] != backbone_params(model) or built["copy_head"] != copy_head_params(model, copy):
        raise RuntimeError(f"parameter count mismatch: built {built} vs analytic {summary}")
    summary["built_on_meta_device"] = built
    summary["layout"] = dict(tp=r.tp, pp=r.pp, cp=r.cp, dp=r.dp, sp=r.sp, seq_len=r.seq_len,
                             micro_batch=r.micro_batch, recompute=r.recompute, dtype=r.dtype,
                             lm_head_loss=r.lm_head_loss, offload_fraction=r.offload_fraction,
                             attention=r.attention, document_masking=r.document_masking)
    param_bytes = 4 if r.dtype == "fp32" else 2
    summary["memory_per_gpu"] = mem = memory_estimate(
        model, copy, tp=r.tp, pp=r.pp, dp=r.dp, seq_len=r.seq_len, micro_batch=r.micro_batch, sp=r.sp,
        param_bytes=param_bytes, recompute=r.recompute, lm_head_loss=r.lm_head_loss,
        offload_fraction=r.offload_fraction, attention=r.attention, document_masking=r.document_masking, cp=r.cp,
    )
    tokens = r.seq_len * r.micro_batch
    summary["lm_head_loss_per_micro_batch_gib"] = {
        impl: {k: v / GIB for k, v in lm_head_loss_bytes(model, tokens, r.tp, impl, param_bytes).items()}
        for impl in ("megatron", "chunked", "fused")
    }
    if r.gpu_memory is not None:
        usable = r.gpu_memory * (1 - r.reserve)
        total = mem["total_distributed_optimizer_gib"]
        summary["fit"] = {"gpu_memory_gib": r.gpu_memory, "usable_gib": usable, "total_gib": total,
                          "fits": total <= usable}
        if r.plan:
            rows = plan_layouts(model, copy, r.gpus, r.seq_len, r.micro_batch, usable, param_bytes, r.attention,
                                r.document_masking)
            summary["plan"] = {"gpus": r.gpus, "usable_gib": usable, "fitting": [x for x in rows if x["fits"]],
                               "considered": len(rows)}
    return summary


def _fmt(n: float) -> str:
    return f"{n:,.0f}"


def format_table(s: Dict[str, object]) -> str:
    """The human-readable summary (and the plan's table, if any)."""
    f = s["forward_flops_per_token"]
    mem = s["memory_per_gpu"]
    lay = s["layout"]
    rows = [
        ("preset", s["preset"]),
        ("backbone parameters", _fmt(s["backbone_params"])),
        ("copy-head parameters", _fmt(s["copy_head_params"])),
        ("total parameters", _fmt(s["total_params"])),
        (f"train FLOPs/token (seq {s['seq_len']})", f"{s['train_flops_per_token']:.4e}"),
        ("  of which copy head", f"{3 * f['copy_head']:.4e} "
         f"({100 * 3 * f['copy_head'] / s['train_flops_per_token']:.2f}%)"),
        ("  backbone-only train FLOPs/token", f"{s['train_flops_per_token_backbone_only']:.4e}"),
        ("layout", f"tp={lay['tp']} pp={lay['pp']} cp={lay['cp']} dp={lay['dp']} sp={lay['sp']} "
                   f"micro_batch={lay['micro_batch']}"),
        ("params per GPU (largest stage)", _fmt(mem["params_per_gpu"])),
        ("weights / grads (GiB)", f"{mem['weights_gib']:.2f} / {mem['grads_gib']:.2f}"),
        ("optimizer states (GiB)", f"{mem['optimizer_gib']:.2f} (distributed optimizer: "
         f"{mem['optimizer_distributed_gib']:.2f}"
         + (f", {mem['optimizer_host_gib']:.2f} offloaded to host memory)" if lay["offload_fraction"] else ")")),
        ("activations (GiB)", f"{mem['activations_gib']:.2f} (stage: {mem['busiest_stage']})"),
        (f"  of which attention ({lay['attention']})", f"{mem['attention_held_gib']:.2f} held, "
         f"{mem['attention_peak_gib']:.2f} one layer's peak"),
        ("LM-head loss, 1 micro-batch (GiB)", "  ".join(
            f"{impl} {v['peak']:.3f}" + (" <-" if impl == lay["lm_head_loss"] else "")
            for impl, v in s["lm_head_loss_per_micro_batch_gib"].items())),
        ("total per GPU (GiB)", f"{mem['total_gib']:.2f} (distributed optimizer: "
         f"{mem['total_distributed_optimizer_gib']:.2f})"),
        ("assumptions", mem["assumptions"]),
    ]
    if "fit" in s:
        fit = s["fit"]
        rows.append((f"fits {fit['gpu_memory_gib']:.1f} GiB GPUs", f"{'yes' if fit['fits'] else 'NO'}: "
                     f"{fit['total_gib']:.2f} of {fit['usable_gib']:.2f} GiB usable (distributed optimizer)"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{key:<{width}}  {value}" for key, value in rows]
    if "plan" in s:
        lines += ["", *format_plan(s["plan"])]
    return "\n".join(lines)


def format_plan(plan: Dict[str, object], limit: int = 8) -> list:
    """The fitting layouts, least costly first (no offload first, then fewest extra FLOPs)."""
    fitting = plan["fitting"]
    lines = [f"layouts of {plan['gpus']} GPUs that fit in {plan['usable_gib']:.1f} GiB: {len(fitting)} of "
             f"{plan['considered']} (distributed optimizer; SP with TP)"]
    if not fitting:
        return lines + ["  none: more GPUs (pipeline stages), a shorter sequence or a smaller micro-batch"]
    lines.append(f"  {'tp':>2} {'pp':>2} {'cp':>2} {'dp':>2}  {'recompute':<9}  {'lm_head_loss':<12}  "
                 f"{'offload':>7}  {'GiB/GPU':>7}  {'+FLOPs':>6}")
    for r in fitting[:limit]:
        lines.append(f"  {r['tp']:>2} {r['pp']:>2} {r['cp']:>2} {r['dp']:>2}  {r['recompute']:<9}  "
                     f"{r['lm_head_loss']:<12}  {r['offload_fraction']:>7.1f}  {r['total_gib']:>7.2f}  "
                     f"{r['extra_flops_pct']:>5.1f}%")
    return lines
