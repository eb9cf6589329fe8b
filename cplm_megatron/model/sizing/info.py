"""What tools/model_info.py reports for a preset or a recipe and a layout: parameter counts (analytic, and of the
model built by `build_run` on the meta device), FLOPs per token, a per-GPU memory estimate, whether it fits a GPU
given by its memory (`--gpu-memory`) and, without one, the named GPUs (`NAMED_GPUS`) with the micro-batch each
holds (the planner's `choose_micro_batch`: the estimate times the measured margin within the memory less a
reserve), and which layouts of N GPUs fit (`--plan`); and the table it prints. The layout is checked as the trainer
checks it (`validate_layout`, `check_context_parallel`: PP x CP is refused with the trainer's error). A recipe
(`--config`) gives its own layout: its model, batch and parallel sections, and the data-parallel size its header
states ("dp=16"), unless `--dp` or `--gpus` say otherwise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import ModelConfig, load_preset
from cplm_megatron.model.sizing.accounting import (
    GIB,
    CopyHeadShape,
    backbone_params,
    copy_head_params,
    lm_head_loss_bytes,
    memory_estimate,
    model_summary,
)
from cplm_megatron.model.sizing.planner import DEVICE_RESERVE, choose_micro_batch, plan_layouts
from cplm_megatron.parallel.config import ParallelConfig

_UNITS = {"": 1e9, "gb": 1e9, "g": 1e9, "gib": 2**30, "mb": 1e6, "mib": 2**20, "tb": 1e12, "tib": 2**40}
# What the named GPUs report as their memory (MiB; nvidia-smi, torch's total_memory): the H200 as measured on the
# lent machine (results/gpu/2026-12-04), the H100 SXM 80GB as its nvidia-smi lists it
NAMED_GPUS = {"H100 80GB": 81_559, "H200 141GB": 143_771}


def memory_text(gib: float) -> str:
    """A memory size in both units: '74.5 GiB = 80.0 GB'."""
    return f"{gib:.1f} GiB = {gib * GIB / 1e9:.1f} GB"


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
    reserve: float = DEVICE_RESERVE  # fraction of the GPU's memory kept free
    plan: bool = False
    gpus: int = 8
    dtype: str = "bf16"
    no_copy_head: bool = False
    copy_heads: int = 4
    copy_head_dim: int = 64
    copy_qk_norm: bool = False
    model: Optional[ModelConfig] = None  # a recipe's model section (tools/model_info.py --config); None: the preset's
    global_batch: Optional[int] = None  # a recipe's train.global_batch (the micro-batches a GPU may choose from)
    layout_source: str = "the command line"  # where dp came from

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
    summary["layout"] = dict(layout_source=r.layout_source, tp=r.tp, pp=r.pp, cp=r.cp, dp=r.dp, sp=r.sp, seq_len=r.seq_len,
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
    if r.gpu_memory is None:
        summary["named_gpus"] = named_gpu_verdicts(r, model, copy, param_bytes)
    else:
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


def _estimate_gib(r: InfoRequest, model: ModelConfig, copy: Optional[CopyHeadShape], param_bytes: int,
                  micro_batch: int) -> float:
    """The per-GPU estimate (distributed optimizer) of the request at `micro_batch`."""
    return memory_estimate(model, copy, tp=r.tp, pp=r.pp, dp=r.dp, seq_len=r.seq_len, micro_batch=micro_batch,
                           sp=r.sp, param_bytes=param_bytes, recompute=r.recompute, lm_head_loss=r.lm_head_loss,
                           offload_fraction=r.offload_fraction, attention=r.attention,
                           document_masking=r.document_masking, cp=r.cp)["total_distributed_optimizer_gib"]


def named_gpu_verdicts(r: InfoRequest, model: ModelConfig, copy: Optional[CopyHeadShape], param_bytes: int
                       ) -> List[Dict[str, Any]]:
    """Per named GPU: its memory, whether the layout fits at its micro-batch and the largest micro-batch that does
    (of those dividing the sequences per step of one replica, the recipe's global batch / dp)."""
    per_replica = r.global_batch // r.dp if r.global_batch and r.global_batch % r.dp == 0 else r.micro_batch
    out = []
    for name, mib in NAMED_GPUS.items():
        choice = choose_micro_batch(lambda m: _estimate_gib(r, model, copy, param_bytes, m), per_replica,
                                    r.micro_batch, mib / 1024, reserve=r.reserve)
        out.append({"gpu": name, "memory_gib": mib / 1024, "memory_gb": mib * 2**20 / 1e9,
                    "fits_at_micro_batch": choice.micro_batch == r.micro_batch and choice.fits,
                    "micro_batch": choice.micro_batch, "micro_batch_fits": choice.fits,
                    "needed_gib": choice.needed_gib, "usable_gib": choice.usable_gib, "line": choice.line()})
    return out


def recipe_dp(text: str) -> Optional[int]:
    """The data-parallel size a recipe's leading comment states ('... dp=16)'), or None."""
    header = "\n".join(line for line in text.splitlines()[:8] if line.startswith("#"))
    match = re.search(r"\bdp=(\d+)", header)
    return int(match.group(1)) if match else None


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
                   f"micro_batch={lay['micro_batch']} ({lay['layout_source']})"),
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
        rows.append((f"fits GPUs of {memory_text(fit['gpu_memory_gib'])}", f"{'yes' if fit['fits'] else 'NO'}: "
                     f"{fit['total_gib']:.2f} of {fit['usable_gib']:.2f} GiB usable (distributed optimizer)"))
    for gpu in s.get("named_gpus", []):
        rows.append((f"{gpu['gpu']} ({memory_text(gpu['memory_gib'])})",
                     f"{'fits' if gpu['fits_at_micro_batch'] else 'does NOT fit'} at micro-batch "
                     f"{lay['micro_batch']}; {gpu['line']}"))
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


def request_from_recipe(args: Dict[str, Any], defaults: Dict[str, Any]) -> Dict[str, Any]:
    """InfoRequest fields from `--config RECIPE [--set ...]` (`args`: the parsed command line, `defaults`: its
    defaults, so options given explicitly win over the recipe's); dp from --dp, else --gpus, else the recipe's
    header, else 8 GPUs."""
    from cplm_megatron.config.loader import recipe_path
    from cplm_megatron.model.layout import validate_layout
    from cplm_megatron.model.lm_head_choice import choose_lm_head_loss
    from cplm_megatron.run_config import load_run_config, overrides_from_args

    path = args.pop("config")
    cfg = load_run_config(path, overrides_from_args(args.pop("set")))
    m, c, p, t = cfg.model, cfg.copy_head, cfg.parallel, cfg.train
    recipe = dict(preset=m.preset or "(recipe)", model=m, tp=p.tp, pp=p.pp, cp=p.cp, sp=p.sp, seq_len=t.seq_len,
                  micro_batch=t.micro_batch, recompute=cfg.recompute.granularity, global_batch=t.global_batch,
                  attention=m.attention_impl if m.attention_impl in ("megatron", "te") else "sdpa",
                  document_masking=cfg.data.document_masking, offload_fraction=cfg.optimizer.offload_fraction,
                  dtype="fp32" if cfg.precision.dtype == "fp32" else "bf16", no_copy_head=not c.enabled,
                  copy_heads=c.heads, copy_head_dim=c.head_dim, copy_qk_norm=c.qk_norm)
    explicit = {k: v for k, v in args.items() if v != defaults.get(k)}
    merged = {**args, **recipe, **{k: v for k, v in explicit.items() if k in recipe}}
    model_parallel = merged["tp"] * merged["pp"] * merged["cp"]
    if args.get("dp"):
        merged["layout_source"] = "dp from --dp"
    else:
        validate_layout(model_parallel, cfg.parallel, m)  # the model's own limits first (TP vs heads, ...)
        stated = recipe_dp(Path(recipe_path(path)).read_text()) if "gpus" not in explicit else None
        gpus = stated * model_parallel if stated else merged["gpus"]
        if gpus % model_parallel:
            raise ConfigError(f"--gpus {gpus} is not a multiple of the recipe's tp x pp x cp = {model_parallel}")
        merged["dp"] = gpus // model_parallel
        merged["layout_source"] = ("dp from the recipe's header" if stated else
                                   f"dp from {'--gpus' if 'gpus' in explicit else 'the default 8'} GPUs")
    loss = explicit.get("lm_head_loss") or m.lm_head_loss
    if loss == "auto":
        memory = merged.get("gpu_memory") or NAMED_GPUS["H100 80GB"] / 1024
        loss = choose_lm_head_loss(m, merged["seq_len"] * merged["micro_batch"] // merged["cp"], merged["tp"],
                                   4 if merged["dtype"] == "fp32" else 2, memory * GIB, "the GPU", True).path
    merged["lm_head_loss"] = loss
    merged["model"] = replace(m, lm_head_loss=loss)
    return merged


def resolve_request(args: Dict[str, Any], defaults: Dict[str, Any]) -> InfoRequest:
    """The InfoRequest of the command line: a preset and explicit options, or a recipe (`--config`)."""
    if args.get("config"):
        return InfoRequest(**request_from_recipe(args, defaults))
    if args.pop("set"):
        raise ConfigError("--set needs --config RECIPE (with --preset, give the options directly)")
    args.pop("config")
    fallback = dict(tp=1, pp=1, cp=1, dp=1, seq_len=2048, micro_batch=1, lm_head_loss="megatron")
    return InfoRequest(**{k: (fallback[k] if v is None and k in fallback else v) for k, v in args.items()})
