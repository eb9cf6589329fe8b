"""The config reference: every key of the run config with its type, default and one line of meaning.

Generated from the config dataclasses themselves (`RunConfig` and its per-concern sections), so a key added to a
dataclass appears here as soon as the page is regenerated (`python tools/config_reference.py`); the page's test
fails while it is stale. A key's meaning is its entry in DESCRIPTIONS, else the comment on its line in the
dataclass (`name: type = default  # meaning`); a key with neither is an error naming it.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Dict, Iterator, List, Tuple

import yaml

from cplm_megatron.data.config import StreamConfig
from cplm_megatron.errors import ConfigError
from cplm_megatron.run_config import RunConfig

PAGE = "docs/config-reference.md"
STREAM_LISTS = ("data.streams", "data.val_streams")  # lists of StreamConfig: documented as `key[].field`

SECTIONS = {
    "run": "the run's identity and directory",
    "model": "the backbone; `model.preset` fills these from `configs/models/<preset>.yaml`, explicit keys override it",
    "copy_head": "the Copy-Paste head (docs/design.md); `enabled: false` is the exact baseline",
    "parallel": "model-parallel sizes; data parallelism is what remains of the world size",
    "precision": "parameter and compute dtype; FP8 backbone GEMMs (Transformer Engine)",
    "recompute": "activation recomputation (Megatron's granularity and method)",
    "optimizer": "AdamW through Megatron's optimizer wrappers (the learning rate is `train.lr`)",
    "schedule": "the learning-rate schedule after warm-up",
    "train": "length, batch shape, cadence and failure policy",
    "checkpoint": "torch_dist checkpoints under `run.dir/checkpoints` (docs/checkpoints.md)",
    "data": "which prepared datasets batches come from and how they are mixed (docs/data.md)",
    "logging": "where metrics go besides the console and `run.dir/metrics.jsonl`",
}

DESCRIPTIONS = {
    "run.dir": "the run's directory: checkpoints, metrics.jsonl, config.yaml, the run record; relaunching resumes it",
    "run.name": "display name (wandb run name); empty: the run dir's name",
    "run.seed": "seed of initialization and dropout",
    "run.check_memory": "refuse a launch the memory planner says does not fit the GPU (or the host, on CPU)",
    "model.preset": "a named shape from configs/models/ (smollm2-135m, llama-7b, ...); empty: the keys below",
    "model.family": "backbone family: llama, qwen3 or gpt2 (layer spec, HF export class)",
    "model.num_layers": "transformer layers",
    "model.hidden_size": "model width d",
    "model.num_attention_heads": "query heads",
    "model.num_query_groups": "key/value heads (grouped-query attention); null: one per query head",
    "model.ffn_hidden_size": "MLP inner width",
    "model.kv_channels": "head dimension; null: hidden_size / num_attention_heads",
    "model.vocab_size": "the tokenizer's vocabulary size",
    "model.vocab_pad_multiple": "the embedding is padded to a multiple of this (independent of TP, so checkpoints reshard)",
    "model.max_position_embeddings": "longest sequence the position embedding covers (>= train.seq_len)",
    "model.position_embedding": "rope or learned_absolute",
    "model.rope_theta": "RoPE base frequency",
    "model.normalization": "RMSNorm or LayerNorm",
    "model.norm_eps": "epsilon of the normalization layers",
    "model.activation": "MLP activation: swiglu or gelu",
    "model.add_bias_linear": "biases in the linear layers",
    "model.tie_embeddings": "share the input embedding and the LM head's weight",
    "model.init_method_std": "standard deviation of the weight initialization",
    "model.layer_spec": "megatron-core layer spec: te (Transformer Engine), local (torch), auto (te when installed)",
    "model.attention_impl": "core attention: sdpa (torch, flash on GPUs), megatron (unfused), te; auto: te with TE, else sdpa",
    "model.lm_head_loss": "LM-head cross entropy: megatron (logits tensor), chunked/fused (tiles, no logits); auto: by memory",
    "model.default_tp": "tensor parallelism suggested for 8-GPU nodes (model_info, SLURM scripts)",
    "model.default_pp": "pipeline parallelism suggested for 8-GPU nodes",
    "copy_head.enabled": "add the Copy-Paste head; false: the plain GPT model (the baseline)",
    "copy_head.heads": "copy heads H_c",
    "copy_head.head_dim": "width d_c of each copy head's queries and keys",
    "copy_head.qk_norm": "RMSNorm on each copy head's queries and keys",
    "copy_head.norm_eps": "epsilon of that RMSNorm",
    "copy_head.gate_bias_init": "initial gate bias (sigmoid(-2) = 0.12: the LM head dominates at the start)",
    "copy_head.mixing": "mixing rule: gate (learned gate), constant (a learned constant), sentinel (pointer sentinel per head)",
    "copy_head.lm_loss_weight": "weight of the LM head's own cross entropy added to the mixture NLL (1: the recipes' default)",
    "copy_head.decouple_lm": "the mixture treats log p_LM as a constant: the LM head learns only from its own cross entropy",
    "copy_head.copy_loss_weight": "weight of the copy-only NLL on positions with a matching candidate",
    "copy_head.impl": "copy-score implementation: naive, chunked (torch), fused (Triton, GPUs); auto: fused on CUDA",
    "copy_head.block_size": "query block of the chunked implementation",
    "copy_head.fp8": "fused implementation: quantize queries and keys to float8_e4m3fn (needs bf16)",
    "parallel.tp": "tensor parallelism (divides the heads and KV heads)",
    "parallel.pp": "pipeline parallelism (divides the layers, times vpp)",
    "parallel.vpp": "virtual pipeline stages (model chunks) per pipeline rank; null: none",
    "parallel.sp": "sequence parallelism over the TP group (needs tp >= 2)",
    "parallel.cp": "context parallelism: each sequence split over cp ranks (docs/context-parallel.md)",
    "parallel.backend": "process-group backend: nccl, gloo, or auto (nccl with CUDA)",
    "parallel.timeout_minutes": "collective timeout: a hung rank fails the run after this long",
    "precision.dtype": "parameter and compute dtype: fp32, bf16 or fp16 (with loss scaling)",
    "precision.fp8": "Transformer Engine FP8 GEMMs in the backbone: hybrid or e4m3; null: off",
    "precision.fp8_recipe": "Transformer Engine FP8 scaling recipe",
    "precision.fp8_amax_history_len": "amax history of the delayed-scaling recipe",
    "precision.fp8_amax_compute_algo": "amax of the delayed-scaling recipe: max or most_recent",
    "recompute.granularity": "recompute activations in the backward: none, selective (attention core) or full",
    "recompute.method": "full recomputation: uniform (every num_layers layers) or block (the first num_layers)",
    "recompute.num_layers": "layers per recomputation unit (full granularity)",
    "optimizer.weight_decay": "AdamW weight decay",
    "optimizer.beta1": "AdamW beta1",
    "optimizer.beta2": "AdamW beta2",
    "optimizer.eps": "AdamW epsilon",
    "optimizer.clip_grad": "clip the global gradient norm to this (0: no clipping)",
    "optimizer.distributed": "Megatron's distributed optimizer (ZeRO-1: optimizer states sharded over data parallel)",
    "optimizer.overlap_grad_reduce": "overlap the gradient reduction with the backward",
    "optimizer.overlap_param_gather": "overlap the distributed optimizer's parameter all-gather with the forward",
    "optimizer.bucket_size": "gradient bucket size in elements; null: megatron-core's default",
    "optimizer.offload_fraction": "share of the optimizer shard kept and stepped on the CPU (GPU + Transformer Engine)",
    "schedule.style": "wsd (warm-up, stable, decay), cosine, linear or constant",
    "schedule.warmup_iters": "linear warm-up iterations",
    "schedule.decay_iters": "cosine/linear: iterations to decay over; null: train.iters",
    "schedule.wsd_decay_fraction": "WSD: final fraction of training spent decaying",
    "schedule.wsd_decay_style": "WSD: shape of the decay",
    "train.iters": "optimizer steps (give this or train.tokens)",
    "train.tokens": "train until this many tokens instead of train.iters",
    "train.micro_batch": "sequences per micro-batch per data-parallel rank",
    "train.global_batch": "sequences per optimizer step (gradient accumulation fills the rest)",
    "train.seq_len": "tokens per sequence",
    "train.lr": "peak learning rate (after warm-up)",
    "train.min_lr": "learning-rate floor of the decay",
    "train.log_interval": "iterations between log lines and metrics.jsonl records",
    "train.eval_interval": "iterations between validations (0: none)",
    "train.eval_iters": "validation micro-batches per data-parallel rank per validation",
    "train.max_nonfinite_steps": "non-finite losses in a row (each skipped) before the run stops with exit 1",
    "train.exit_after_iters": "stop with a checkpoint and exit 75 after this many iterations of this launch",
    "train.probe_interval": "iterations between probes of in-context copying (copy accuracy, in-context score) into "
                            "metrics.jsonl, also before a fresh run's first step (0: none; needs pp = cp = 1)",
    "train.probe_sequences": "copy-task sequences per probe",
    "train.probe_copy_length": "tokens per probe copy sequence (a span and its repeat)",
    "checkpoint.enabled": "save checkpoints (false: benchmarks; a stop signal then just stops)",
    "checkpoint.interval": "iterations between checkpoints (0: only at the end and on a stop signal)",
    "checkpoint.keep": "complete checkpoints kept (the newest)",
    "checkpoint.async_save": "write checkpoints in the background",
    "checkpoint.load": "start a new run from this run dir or checkpoint when run.dir has none",
    "checkpoint.load_optimizer": "with load: also restore the optimizer, scheduler and data position",
    "checkpoint.resume": "resume from run.dir's latest checkpoint",
    "checkpoint.overwrite": "with resume=false: delete run.dir's checkpoints (after every other check passed)",
    "data.repeat_span_share": "share of training samples in which a span of their own text recurs later (speeds "
                              "up in-context copying; the same samples for every run of one data.seed; 0: off)",
    "data.streams": "training datasets: a list of paths (prepared directories or s3:// URLs) or of {path, weight} entries",
    "data.streams[].path": "a prepared dataset directory or an s3://bucket/prefix",
    "data.streams[].name": "a label for messages; empty: the path",
    "data.streams[].proportion": "relative share of the epoch (all streams then give one)",
    "data.streams[].repeat": "multiplier on the stream's size",
    "data.streams[].choose": "exact samples per epoch from this stream",
    "data.val_streams": "validation datasets, as data.streams",
    "data.val_streams[].path": "as data.streams[].path",
    "data.val_streams[].name": "as data.streams[].name",
    "data.val_streams[].proportion": "as data.streams[].proportion",
    "data.val_streams[].repeat": "as data.streams[].repeat",
    "data.val_streams[].choose": "as data.streams[].choose",
    "data.seed": "shuffle seed (and the seed of stream resampling)",
    "data.shuffle": "shuffle the training order (validation is never shuffled)",
    "data.num_workers": "DataLoader worker processes per rank (0: read in the training process)",
    "data.document_masking": "attention and positions restart at each document (false: plain causal over the packed row)",
    "data.eod_mask_loss": "no loss on predictions made from an end-of-document input",
    "data.epoch_size": "samples per epoch when mixing by proportion; null: the streams' total",
    "data.cache_dir": "where remote shards are downloaded and local ones decompressed; null: $TMPDIR / in place",
    "data.verify_shards": "hash-check local shards at start, once per machine (sizes are always checked)",
    "data.synthetic": "generated task data instead of streams: spamlang, copy, copy_random, passkey, or a + mixture",
    "logging.tensorboard": "write TensorBoard event files to run.dir/tensorboard",
    "logging.wandb": "log to Weights & Biases from rank 0",
    "logging.wandb_mode": "offline (files under run.dir), online, or disabled",
    "logging.wandb_project": "wandb project",
    "logging.wandb_entity": "wandb entity (team); null: your default",
    "logging.peak_tflops": "per-device peak TFLOP/s for MFU; null: the GPU's dense bf16 peak (CPU: 1)",
}


@dataclasses.dataclass(frozen=True)
class Key:
    """One documented key."""

    key: str
    type: str
    default: str
    meaning: str


def _type_text(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = re.sub(r"Optional\[(.*)\]$", r"\1 | None", text)
    text = re.sub(r"Literal\[(.*)\]", lambda m: m.group(1).replace("'", "").replace('"', "").replace(", ", "|"), text)
    return text.replace("List[StreamConfig]", "list").replace("list[StreamConfig]", "list")


def _default_text(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        return "{}"
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").removesuffix("...").strip()


def _inline_comment(cls: type, name: str) -> str:
    """The comment on the line that declares `name` in `cls`'s source ('' if none)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return ""
    match = re.search(rf"^\s+{re.escape(name)}\s*:[^\n#]*#\s*(.+)$", source, flags=re.M)
    return match.group(1).strip() if match else ""


def meaning(key: str, owner: type, name: str) -> str:
    """A key's one line of meaning (DESCRIPTIONS, else its inline comment); a ConfigError if it has none."""
    text = DESCRIPTIONS.get(key) or _inline_comment(owner, name)
    if not text:
        raise ConfigError(f"config key {key} has no description: add it to DESCRIPTIONS in "
                          f"cplm_megatron/training/config_reference.py (or a comment on its line in "
                          f"{owner.__name__}), then run `python tools/config_reference.py`")
    return text


def _fields(obj: Any, prefix: str) -> Iterator[Key]:
    for f in dataclasses.fields(obj):
        key, value = f"{prefix}.{f.name}", getattr(obj, f.name)
        yield Key(key, _type_text(f.type), _default_text(value), meaning(key, type(obj), f.name))
        if key in STREAM_LISTS:
            yield from _fields(StreamConfig(path=""), f"{key}[]")


def reference_keys(root: type = RunConfig) -> Dict[str, List[Key]]:
    """Every key of `root` (a RunConfig-like dataclass of sections) by section, in declaration order."""
    config = root()
    return {s.name: list(_fields(getattr(config, s.name), s.name)) for s in dataclasses.fields(config)}


def render(root: type = RunConfig) -> str:
    """The config reference page (markdown)."""
    lines = [
        "# Config reference",
        "",
        "<!-- generated by `python tools/config_reference.py` from the config dataclasses; do not edit -->",
        "",
        "Every key of a run config: a recipe (`configs/*.yaml`) sets them per section, `--set section.key=value`",
        "overrides them, and `pretrain/pretrain_cplm.py --config RECIPE --print-config --describe` prints the",
        "resolved values with these descriptions. Defaults are the dataclasses' own; the recipes set most of them.",
        "",
    ]
    for section, keys in reference_keys(root).items():
        lines += [f"## `{section}`", "", SECTIONS.get(section, ""), "", "| key | type | default | meaning |",
                  "|---|---|---|---|"]
        lines += [f"| `{k.key}` | {_cell(k.type)} | `{_cell(k.default)}` | {_cell(k.meaning)} |" for k in keys]
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def describe(config: RunConfig) -> str:
    """A resolved config as YAML with each key's meaning as a trailing comment (`--print-config --describe`)."""
    flat = {k.key: k for keys in reference_keys(type(config)).values() for k in keys}
    out: List[str] = []
    for section, values in config.to_dict().items():
        out.append(f"{section}:  # {SECTIONS.get(section, '')}")
        for name, value in values.items():
            text = _default_text(value) or "''"
            key = flat.get(f"{section}.{name}")
            out.append(f"  {name}: {text}" + (f"  # {key.meaning}" if key else ""))
    return "\n".join(out) + "\n"


def stale_lines(committed: str, generated: str) -> List[Tuple[str, str]]:
    """(committed, generated) line pairs that differ (for the test's message)."""
    a, b = committed.splitlines(), generated.splitlines()
    return [(x, y) for x, y in zip(a + [""] * (len(b) - len(a)), b + [""] * (len(a) - len(b))) if x != y]
