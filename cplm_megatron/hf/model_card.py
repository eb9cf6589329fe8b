"""The model card (README.md) of an export: what the model is, how it was trained, its copy head and how to load
it, and its evaluation figures when the run holds an eval.json (`tools/evaluate.py --output RUN/eval.json`).

Everything comes from the checkpoint (its saved run config and record) and the written HF config; the evaluation
arrives as the evaluator's per-checkpoint results (the caller reads them with `evaluation.results`)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig

from cplm_megatron.hf.megatron_checkpoint import MegatronCheckpoint

CARD_NAME = "README.md"
EVAL_RESULTS_NAME = "eval.json"  # where the docs' evaluate command writes a run's results


def run_dir_of(checkpoint_root: Path) -> Path:
    """The run directory of a checkpoint root (RUN/checkpoints), else the root itself (a converted checkpoint)."""
    root = Path(checkpoint_root)
    return root.parent if root.name == "checkpoints" else root


def parameter_count(state: Mapping[str, torch.Tensor]) -> int:
    """Parameters of an HF state dict, one tensor under two names (tied embeddings) counted once (views of one
    stacked tensor, each layer's slice, share a storage but not a first element)."""
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    for tensor in state.values():
        seen[(tensor.data_ptr(), tuple(tensor.shape))] = tensor.numel()
    return sum(seen.values())


def model_card(ckpt: MegatronCheckpoint, config: PretrainedConfig, out_dir: Path, parameters: int,
               evaluation: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The README.md text of the export of `ckpt` (HF `config`) in `out_dir`; `evaluation`: eval.json's
    per-checkpoint results, of which the exported iteration's (else the last) is shown."""
    cplm = ckpt.copy_head is not None
    architecture = (config.architectures or [type(config).__name__])[0]
    sections = [
        _front_matter(cplm),
        f"# {Path(out_dir).name}\n\n{architecture} exported by cplm-megatron from iteration "
        f"{ckpt.record.iteration:,} of the run in `{run_dir_of(ckpt.root)}`"
        f"{' (a Copy-Paste Language Model: an LM head and a copy head, mixed)' if cplm else ''}.",
        _model_section(ckpt, config, architecture, parameters),
        _training_section(ckpt),
    ]
    if cplm:
        sections.append(_copy_head_section(ckpt, config))
    sections += [_loading_section(out_dir, cplm), _evaluation_section(ckpt, evaluation)]
    return "\n\n".join(sections) + "\n"


def write_model_card(out_dir: Path, text: str) -> Path:
    """Write the card as OUT/README.md."""
    path = Path(out_dir) / CARD_NAME
    path.write_text(text)
    return path


def _front_matter(cplm: bool) -> str:
    tags = ["cplm", "copy-paste-language-model", "megatron-core"] if cplm else ["megatron-core"]
    return "---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n" + \
        "".join(f"- {tag}\n" for tag in tags) + "---"


def _table(rows: Sequence[tuple[str, object]], header: tuple[str, str] = ("", "")) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    return "\n".join(lines + [f"| {key} | {value} |" for key, value in rows])


def _model_section(ckpt: MegatronCheckpoint, config: PretrainedConfig, architecture: str, parameters: int) -> str:
    model = ckpt.model
    rows = [
        ("architecture", f"`{architecture}` ({model.family} backbone)"),
        ("parameters", f"{parameters:,} ({parameters / 1e6:,.1f}M)"),
        ("layers / hidden size", f"{model.num_layers} / {model.hidden_size}"),
        ("attention heads / key-value heads", f"{model.num_attention_heads} / {model.kv_heads}"),
        ("feed-forward size", model.ffn_hidden_size),
        ("vocabulary", f"{config.vocab_size:,}"),
        ("context (max positions)", f"{config.max_position_embeddings:,}"),
        ("positions / norm / activation", f"{model.position_embedding} / {model.normalization} / {model.activation}"),
        ("tied embeddings", "yes" if model.tie_embeddings else "no"),
        ("weights dtype", str(getattr(config, "dtype", "float32")).replace("torch.", "")),
    ]
    return "## Model\n\n" + _table(rows, ("", "value"))


def _data_text(data: Mapping[str, Any]) -> str:
    if data.get("synthetic"):
        return f"synthetic `{data['synthetic']}` samples"
    streams = [s.get("path") if isinstance(s, Mapping) else str(s) for s in data.get("streams") or []]
    return ", ".join(f"`{s}`" for s in streams) or "not recorded"


def _training_section(ckpt: MegatronCheckpoint) -> str:
    config = ckpt.config
    train, optimizer = config.get("train", {}), config.get("optimizer", {})
    schedule, record = config.get("schedule", {}), ckpt.record
    tokens = record.consumed_tokens or record.iteration * train.get("global_batch", 0) * train.get("seq_len", 0)
    rows = [
        ("tokens trained", f"{tokens:,} ({record.iteration:,} iterations of {train.get('global_batch')} sequences "
                           f"x {train.get('seq_len')} tokens)"),
        ("data", _data_text(config.get("data", {}))),
        ("optimizer", f"AdamW, lr {train.get('lr')} -> {train.get('min_lr')} ({schedule.get('style')} schedule, "
                      f"{schedule.get('warmup_iters')} warm-up iterations), weight decay "
                      f"{optimizer.get('weight_decay')}, betas ({optimizer.get('beta1')}, {optimizer.get('beta2')})"),
        ("precision", config.get("precision", {}).get("dtype", "not recorded")),
        ("saved at layout", record.layout_text),
        ("seed", config.get("run", {}).get("seed", "not recorded")),
    ]
    preset = ckpt.model.preset if getattr(ckpt.model, "preset", None) else None
    head = f"## Training\n\ncplm-megatron{f', recipe preset `{preset}`' if preset else ''}.\n\n"
    return head + _table(rows, ("", "value"))


def _copy_head_section(ckpt: MegatronCheckpoint, config: PretrainedConfig) -> str:
    head = ckpt.copy_head
    lm_weight = getattr(head, "lm_loss_weight", 0.0)
    objective = "the mixture's negative log-likelihood" + (
        f" + {lm_weight:g} x the LM head's own cross entropy" if lm_weight else "")
    return (
        "## The copy head\n\n"
        f"Beside the LM head, a copy head ({head.heads} heads x {head.head_dim} dimensions) scores the earlier "
        "positions of the same document: the next token can be copied from the token that followed a matching "
        f"position. The next-token distribution is a mixture of the LM head's softmax and the copy distribution "
        f"(`{head.mixing}` mixing, `copy_mixing` in config.json); the model's `logits` are the log-probabilities "
        "of that mixture, so `generate()`, sampling and lm-eval use it unchanged, and cached generation caches "
        f"the copy keys. Copy candidates never cross the end-of-document token (id {config.copy_eod_token_id}, "
        f"`copy_reset_at_eod`), as in training. Trained on {objective}."
    )


def _loading_section(out_dir: Path, cplm: bool) -> str:
    remote = ", trust_remote_code=True" if cplm else ""
    code = (
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{out_dir}"{remote})\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{out_dir}"{remote})\n'
        'ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids\n'
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=32, do_sample=False)[0]))\n```"
    )
    if not cplm:
        return f"## How to load\n\nA standard transformers directory (no custom code):\n\n{code}"
    return (
        "## How to load\n\n"
        "The model's code ships in this directory (`modeling_cplm.py`, `configuration_cplm.py`, `mixing.py`): "
        "load it with `trust_remote_code=True`. Transformers 5 reads config.json before the tokenizer's own "
        "config, so the tokenizer takes the same flag (or load it as `PreTrainedTokenizerFast.from_pretrained`, "
        f"which runs no model code).\n\n{code}"
    )


def _evaluation_section(ckpt: MegatronCheckpoint, evaluation: Sequence[Mapping[str, Any]] | None) -> str:
    eval_path = run_dir_of(ckpt.root) / EVAL_RESULTS_NAME
    if not evaluation:
        return (f"## Evaluation\n\nNo evaluation was found beside the run ({eval_path}). Evaluate this directory "
                "with `tools/evaluate.py --hf DIR --tasks copy,passkey,spamlang --output eval.json`.")
    iteration = ckpt.record.iteration
    entry = next((e for e in evaluation if e.get("iteration") == iteration), evaluation[-1])
    note = "" if entry.get("iteration") == iteration else (
        f" Note: these figures are of iteration {entry.get('iteration')}, not of the exported iteration {iteration}.")
    rows = [(f"{task} / {metric}", _number(value)) for task, result in entry.get("tasks", {}).items()
            for metric, value in result.get("metrics", {}).items()]
    return (f"## Evaluation\n\n`tools/evaluate.py` results of iteration {entry.get('iteration')} ({eval_path}).{note}"
            "\n\n" + _table(rows, ("task / metric", "value")))


def _number(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return str(value)
