"""Checkpoint conversion both ways: Megatron torch_dist <-> Hugging Face (the tools call these).

- `convert_to_hf`: a trainer checkpoint saved at any TP/PP -> an HF directory (CPLMForCausalLM with
  the copy head, LlamaForCausalLM without, GPT2LMHeadModel for the gpt2 family).
- `convert_from_hf`: a local Llama-family HF directory -> a weights-only checkpoint root that
  pretrain_cplm.py continues from at any TP/PP (`checkpoint.load=ROOT checkpoint.load_optimizer=false`).

Config mapping: config_mapping.py; tensor mapping: weight_mapping.py; file I/O: megatron_checkpoint.py
and hf_files.py; the export's tokenizer: tokenizer_lookup.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cplm_megatron.checkpoint.lookup import read_live
from cplm_megatron.config.loader import to_dict
from cplm_megatron.hf.config_mapping import (
    ConversionError,
    check_exportable,
    check_preset_matches,
    copy_head_config_from_hf,
    hf_config_from_megatron,
    model_config_from_hf,
)
from cplm_megatron.hf.export import write_hf_checkpoint
from cplm_megatron.hf.hf_files import (
    copy_tokenizer_files,
    read_hf_config,
    read_hf_state_dict,
)
from cplm_megatron.hf.megatron_checkpoint import (
    MegatronCheckpoint,
    open_checkpoint,
    read_tensors,
    write_weights_checkpoint,
)
from cplm_megatron.hf.model_card import EVAL_RESULTS_NAME, model_card, parameter_count, run_dir_of, write_model_card
from cplm_megatron.hf.tokenizer_lookup import TOKENIZER_SUBDIR, find_tokenizer
from cplm_megatron.hf.weight_mapping import (
    EMBEDDING,
    POSITIONS,
    hf_to_megatron,
    megatron_keys,
    megatron_to_hf,
)
from cplm_megatron.model.config import ModelConfig
from cplm_megatron.model.copy_head import CopyHeadConfig
from cplm_megatron.run_config import RunConfig, build_run_config

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _millions(tensors: dict[str, torch.Tensor]) -> str:
    return f"{sum(t.numel() for t in tensors.values()) / 1e6:,.2f}M parameters"


def convert_to_hf(
    checkpoint: str | Path,
    output: str | Path,
    tokenizer: str | Path | None = None,
    dtype: str | None = None,
    read_evaluation: Callable[[Path], Sequence[Mapping[str, Any]] | None] | None = None,
) -> Path:
    """Export a trainer checkpoint (run dir, checkpoints root or iter_* dir) as an HF directory `output`, with its
    model card (README.md).

    `dtype` ("fp32"/"bf16") defaults to bf16 for bf16 checkpoints and fp32 otherwise. `read_evaluation`: reads the
    run's eval.json (when there is one) into per-checkpoint results for the card (evaluation.results, which this
    layer does not import).
    """
    if dtype is not None and dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    # A run still training may prune the checkpoint while it is read: then the newest complete one is read.
    ckpt, tensors, tokenizer_dir = read_live(Path(checkpoint), lambda ref: _read_checkpoint(ref.path, tokenizer),
                                             say=log.warning)
    positions = tensors[POSITIONS].shape[0] if POSITIONS in tensors else None
    hf_config = hf_config_from_megatron(ckpt.model, ckpt.copy_head, gpt2_positions=positions)
    state = megatron_to_hf(tensors, ckpt.model, ckpt.copy_head)
    saved_dtype = tensors[EMBEDDING].dtype
    out_dtype = DTYPES[dtype] if dtype else (torch.bfloat16 if saved_dtype == torch.bfloat16 else torch.float32)
    log.info("writing %s (%s, %s) to %s", type(hf_config).__name__, hf_config.model_type, out_dtype, output)
    out = write_hf_checkpoint(output, hf_config, state, tokenizer_dir, out_dtype)
    _write_card(ckpt, out, parameter_count(state), read_evaluation)
    return out


def _write_card(ckpt: MegatronCheckpoint, out: Path, parameters: int,
                read_evaluation: Callable[[Path], Sequence[Mapping[str, Any]] | None] | None) -> None:
    """README.md of the export, with the run's evaluation when it has an eval.json."""
    eval_path = run_dir_of(ckpt.root) / EVAL_RESULTS_NAME
    evaluation = read_evaluation(eval_path) if read_evaluation and eval_path.is_file() else None
    card = write_model_card(out, model_card(ckpt, read_hf_config(out), out, parameters, evaluation))
    log.info("model card: %s%s", card, f" (evaluation from {eval_path})" if evaluation else "")


def _read_checkpoint(iter_dir: Path, tokenizer: str | Path | None):
    """(checkpoint, its tensors, the tokenizer directory) of one iter_* directory."""
    ckpt = open_checkpoint(iter_dir)
    log.info("checkpoint %s: iteration %s, saved at %s; %s family, copy head %s", ckpt.path, ckpt.record.iteration,
             ckpt.record.layout_text, ckpt.model.family, "on" if ckpt.copy_head else "off")
    check_exportable(ckpt.model, ckpt.copy_head)  # before the slow parts
    tokenizer_dir = Path(tokenizer) if tokenizer is not None else find_tokenizer(ckpt)
    log.info("tokenizer: %s", tokenizer_dir)

    start = time.monotonic()
    tensors = read_tensors(ckpt.path, megatron_keys(ckpt.model, ckpt.copy_head))
    log.info("read %d tensors (%s) in %.1f s", len(tensors), _millions(tensors), time.monotonic() - start)
    return ckpt, tensors, tokenizer_dir


def import_configs(
    hf_dir: Path, copy_head: bool, preset: str | None, copy_heads: int | None, copy_head_dim: int | None
) -> tuple[ModelConfig, CopyHeadConfig, bool]:
    """(model config, copy-head config, whether the copy head's weights come from the HF checkpoint)."""
    hf_config = read_hf_config(hf_dir)
    source = str(hf_dir / "config.json")
    model = model_config_from_hf(hf_config, source)
    if preset:
        model = check_preset_matches(preset, model, source)
    head = copy_head_config_from_hf(hf_config, copy_head, copy_heads, copy_head_dim)
    trained_head = copy_head and hf_config.model_type == "cplm"
    log.info("%s: %s, %d layers, hidden %d, %d/%d heads/kv heads, vocab %d%s; copy head: %s", hf_dir,
             hf_config.model_type, model.num_layers, model.hidden_size, model.num_attention_heads, model.kv_heads,
             model.vocab_size, f" (preset {preset})" if preset else "",
             "off" if not copy_head else "trained (kept)" if trained_head else
             f"fresh, {head.heads} x {head.head_dim}")
    if hf_config.model_type == "cplm" and not copy_head:
        log.warning("--no-copy-head: dropping the trained copy head of %s", hf_dir)
    return model, head, trained_head


def convert_from_hf(
    hf_dir: str | Path,
    output: str | Path,
    copy_head: bool = True,
    preset: str | None = None,
    copy_heads: int | None = None,
    copy_head_dim: int | None = None,
    seed: int = 1234,
) -> Path:
    """Convert a local Llama-family HF checkpoint into a weights-only checkpoint root `output`.

    The copy head is freshly initialized (Megatron's init, `seed`) unless `copy_head` is False or the
    source is an HF CPLM (its trained head is kept). The run config written beside the weights has
    the model/copy-head sections, so convert_to_hf round-trips it. Must run in a single process.
    """
    hf_dir, output = Path(hf_dir), Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f"output {output} exists and is not an empty directory; remove it or choose another")
    model, head, trained_head = import_configs(hf_dir, copy_head, preset, copy_heads, copy_head_dim)
    start = time.monotonic()
    state = read_hf_state_dict(hf_dir)
    log.info("read %d HF tensors (%s) from %s in %.1f s", len(state), _millions(state), hf_dir,
             time.monotonic() - start)
    tensors = hf_to_megatron(state, model, head if trained_head else None)
    del state
    model_section = {"preset": preset} if preset else to_dict(model)
    # Only the model/copy-head sections matter to readers; the train section just has to be valid.
    train = RunConfig().train
    train.seq_len = min(train.seq_len, model.max_position_embeddings)
    run_config = build_run_config({"model": model_section, "copy_head": to_dict(head), "train": to_dict(train)})
    run_config = run_config.to_dict()
    iter_dir = write_weights_checkpoint(output, model, head if copy_head else None, tensors, run_config, seed)
    copied = copy_tokenizer_files(hf_dir, output / TOKENIZER_SUBDIR)
    if copied:
        log.info("copied the tokenizer (%s) to %s", ", ".join(copied), output / TOKENIZER_SUBDIR)
    else:
        log.warning("no tokenizer files in %s; convert_to_hf will need --tokenizer", hf_dir)
    log.info("wrote %s; continue training with --set %s", iter_dir, " ".join(continue_overrides(output, run_config)))
    return output


def _override_value(value: object) -> str:
    """A config value as YAML in a `--set key=value` item."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


# Fields that decide the checkpoint's shapes and numerics: printed explicitly, since a recipe's own
# preset would otherwise fill them in.
_MODEL_FIELDS_NOT_PRINTED = ("preset", "init_method_std", "layer_spec", "default_tp", "default_pp")
_COPY_HEAD_FIELDS = ("enabled", "heads", "head_dim", "qk_norm", "norm_eps", "mixing")


def continue_overrides(root: Path, run_config: dict) -> list[str]:
    """The pretrain_cplm.py `--set` items that start training from a converted checkpoint root."""
    items = [f"checkpoint.load={root}", "checkpoint.load_optimizer=false"]
    model, head = run_config["model"], run_config["copy_head"]
    if model.get("preset"):
        items.append(f"model.preset={model['preset']}")
    else:
        items += [f"model.{key}={_override_value(value)}" for key, value in model.items()
                  if key not in _MODEL_FIELDS_NOT_PRINTED]
    fields = _COPY_HEAD_FIELDS if head["enabled"] else ("enabled",)
    return items + [f"copy_head.{key}={_override_value(head[key])}" for key in fields]
