"""Write a Hugging Face checkpoint directory (safetensors, config, generation config, tokenizer).

Used by the Megatron -> HF converter: it hands over a config and an HF-named state dict; this module
checks them against each other, writes the weights (sharded, tied embeddings stored once), and for
CPLM copies the self-contained model code next to them with an ``auto_map`` so the directory loads
offline with ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)``.
"""

import copy
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from cplm_megatron.data.tokenizer import TOKENIZER_DEFINING_FILES
from cplm_megatron.hf.modeling_cplm import CPLMForCausalLM
from cplm_megatron.model.backbones import registry

log = logging.getLogger(__name__)

_HF_DIR = Path(__file__).resolve().parent
# The self-contained model code shipped in every CPLM export: file name there -> source here. mixing.py is
# the training side's own mixing module (cplm_megatron/model/mixing.py), so exports mix as training does.
CPLM_CODE_FILES = {
    "configuration_cplm.py": _HF_DIR / "configuration_cplm.py",
    "modeling_cplm.py": _HF_DIR / "modeling_cplm.py",
    "mixing.py": _HF_DIR.parent / "model" / "mixing.py",
}
CPLM_AUTO_MAP = {
    "AutoConfig": "configuration_cplm.CPLMConfig",
    "AutoModelForCausalLM": "modeling_cplm.CPLMForCausalLM",
}
# model_type -> the class an export loads as: CPLM, and each backbone family's own (cplm_megatron/model/backbones/)
MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "cplm": CPLMForCausalLM,
    **{cls.config_class.model_type: cls for cls in (spec.hf_model_class() for spec in registry().values())},
}
# the files that define tokenization, plus the ones an export should carry along
TOKENIZER_FILES = TOKENIZER_DEFINING_FILES + ("vocab.txt", "chat_template.jinja", "chat_template.json")
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3
_MAX_NAMES_IN_ERROR = 20


def write_hf_checkpoint(
    out_dir: str | Path,
    config: PretrainedConfig,
    state_dict: Mapping[str, torch.Tensor],
    tokenizer_dir: str | Path | None,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Write `state_dict` (HF parameter names) + `config` as an HF checkpoint in a new/empty `out_dir`.

    CPLM configs get the copied model code and an `auto_map`; a backbone family's config exports as its plain
    class (`LlamaForCausalLM`, `GPT2LMHeadModel`, `Qwen3ForCausalLM`). With `tokenizer_dir`, its files are
    copied and the special token ids (bos/eos/pad) in config.json and generation_config.json are taken from
    the tokenizer, as is a CPLM's `copy_eod_token_id` (its EOS: the end-of-document id training packed documents with),
    and the tokenizer's `model_max_length` is the model's max positions.
    """
    out = Path(out_dir)
    model_class = model_class_for(config)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"write_hf_checkpoint: dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"write_hf_checkpoint: output {out} exists and is not an empty directory; remove it "
                              "or choose another output directory")
    config = copy.deepcopy(config)
    tokenizer = None
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer(tokenizer_dir)
        _adopt_tokenizer_special_ids(config, tokenizer)
    tensors = checked_tensors(model_class, config, state_dict)

    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out, tensors, dtype, max_shard_bytes)
    _write_config(out, config, model_class, dtype)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(out)
    if tokenizer_dir is not None:
        _copy_tokenizer_files(Path(tokenizer_dir), out, getattr(config, "max_position_embeddings", None))
    log.info("wrote %s checkpoint (%d tensors, %s) to %s", model_class.__name__, len(tensors), dtype, out)
    return out


def model_class_for(config: object) -> type[PreTrainedModel]:
    """The HF model class a config exports to (by `model_type`, so a remote-code CPLMConfig works too)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_CLASSES:
        raise ValueError(
            f"write_hf_checkpoint: unsupported config {type(config).__name__} (model_type={model_type!r}); "
            f"supported model types: {sorted(MODEL_CLASSES)}"
        )
    return MODEL_CLASSES[model_type]


def load_tokenizer(tokenizer_dir: str | Path) -> PreTrainedTokenizerBase:
    """Load a local HF tokenizer directory, failing early with the path and what is expected."""
    path = Path(tokenizer_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist (pass a directory written by a "
                                "transformers tokenizer's save_pretrained)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"tokenizer directory {path} holds none of the tokenizer files {list(TOKENIZER_FILES)}")
    try:
        # trust_remote_code=False: only standard tokenizers are copied, and an exported CPLM directory
        # (config.json with auto_map) must not trigger the interactive remote-code prompt.
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers raises many types here; re-raise with the path
        raise ValueError(f"cannot load the tokenizer in {path} with AutoTokenizer: {err}") from err


def _adopt_tokenizer_special_ids(config: object, tokenizer: PreTrainedTokenizerBase) -> None:
    """Check the tokenizer fits the embedding and make the config's bos/eos/pad ids the tokenizer's."""
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                         f"{config.vocab_size}; token ids would index past the embedding")
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    if getattr(config, "model_type", None) == "cplm":
        config.copy_eod_token_id = tokenizer.eos_token_id  # the EOD that separated training documents


def _output_embedding_name(model: PreTrainedModel) -> str | None:
    """State-dict name of the output embedding when it is tied to the input embedding, else None."""
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    if output is None or output.weight is not inputs.weight:
        return None
    return next(name for name, module in model.named_modules() if module is output) + ".weight"


def _input_embedding_name(model: PreTrainedModel) -> str:
    inputs = model.get_input_embeddings()
    return next(name for name, module in model.named_modules() if module is inputs) + ".weight"


def _names(names: set[str]) -> str:
    ordered = sorted(names)
    more = len(ordered) - _MAX_NAMES_IN_ERROR
    return ", ".join(ordered[:_MAX_NAMES_IN_ERROR]) + (f" ... and {more} more" if more > 0 else "")


def checked_tensors(
    model_class: type[PreTrainedModel], config: object, state_dict: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The tensors to save, in model order; raises naming missing/unexpected/mis-shaped keys.

    A tied output embedding is stored once (under the input embedding's name); if the state dict
    also carries it, it must equal the input embedding.
    """
    with torch.device("meta"):
        model = model_class(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    tied_name = _output_embedding_name(model)
    given = dict(state_dict)
    if tied_name is not None:
        expected.pop(tied_name)
        if tied_name in given:
            embedding_name = _input_embedding_name(model)
            if embedding_name in given and not torch.equal(given[tied_name], given[embedding_name]):
                raise ValueError(f"the config ties embeddings but {tied_name} differs from {embedding_name}; "
                                 "set tie_word_embeddings=False in the config or drop the output weight")
            del given[tied_name]
    not_tensors = {name for name, value in given.items() if not isinstance(value, torch.Tensor)}
    if not_tensors:
        raise TypeError(f"state dict values must be tensors; not tensors: {_names(not_tensors)}")
    missing = set(expected) - set(given)
    unexpected = set(given) - set(expected)
    mismatched = {
        f"{name} {list(given[name].shape)} (config expects {list(shape)})"
        for name, shape in expected.items()
        if name in given and tuple(given[name].shape) != shape
    }
    problems = []
    if missing:
        problems.append(f"missing keys: {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_names(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {_names(mismatched)}")
    if problems:
        raise ValueError(f"state dict does not match the {model_class.__name__} config: " + "; ".join(problems))
    return {name: given[name] for name in expected}


def _saveable(tensor: torch.Tensor, dtype: torch.dtype, seen_storages: set[int]) -> torch.Tensor:
    """`tensor` on CPU in `dtype` (floats only), owning its storage (safetensors rejects shared memory)."""
    tensor = tensor.detach().to(device="cpu", dtype=dtype if tensor.is_floating_point() else tensor.dtype)
    tensor = tensor.contiguous()
    storage = tensor.untyped_storage()
    if storage.data_ptr() in seen_storages or storage.nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()
    seen_storages.add(tensor.untyped_storage().data_ptr())
    return tensor


def write_safetensors(
    out: Path, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, max_shard_bytes: int
) -> list[str]:
    """Write `tensors` as model.safetensors, or as shards + model.safetensors.index.json; return file names."""
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[list[str]] = [[]]
    shard_bytes = 0
    total_bytes = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * (dtype.itemsize if tensor.is_floating_point() else tensor.element_size())
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(name)
        shard_bytes += size
        total_bytes += size
    if len(shards) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    # a bar on a terminal (tqdm's disable=None): the tensors converted to `dtype`, by bytes, then each file written
    with tqdm(total=total_bytes, desc="convert tensors", unit="B", unit_scale=True, disable=None, leave=False) as bar:
        for index, (file_name, names) in enumerate(zip(files, shards)):
            seen: set[int] = set()
            shard = {}
            for name in names:
                shard[name] = _saveable(tensors[name], dtype, seen)
                bar.update(shard[name].numel() * shard[name].element_size())
            bar.set_description(f"write {file_name}")
            save_file(shard, out / file_name, metadata={"format": "pt"})
            log.info("wrote %s (%d/%d, %d tensors)", file_name, index + 1, len(files), len(names))
    if len(files) > 1:
        weight_map = {name: file_name for file_name, names in zip(files, shards) for name in names}
        index_doc = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2) + "\n")
    return files


def _write_config(out: Path, config: object, model_class: type[PreTrainedModel], dtype: torch.dtype) -> None:
    """config.json (+ the CPLM code files and auto_map for CPLM)."""
    config.architectures = [model_class.__name__]
    config.dtype = dtype
    if model_class is CPLMForCausalLM:
        config.auto_map = dict(CPLM_AUTO_MAP)
        for file_name, source in CPLM_CODE_FILES.items():
            shutil.copyfile(source, out / file_name)
    config.save_pretrained(out)
    config_path = out / "config.json"
    config_path.write_text(json.dumps(with_legacy_rope_fields(json.loads(config_path.read_text())), indent=2,
                                      sort_keys=True) + "\n")


def with_legacy_rope_fields(config_dict: dict) -> dict:
    """Add transformers-4.x RoPE keys (`rope_theta`, `rope_scaling`) beside 5.x `rope_parameters`.

    transformers 4.x ignores `rope_parameters` and would silently fall back to rope_theta=10000;
    5.x reads either form, so writing both keeps the directory right for both.
    """
    rope = config_dict.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return config_dict
    legacy = dict(config_dict)
    legacy.setdefault("rope_theta", rope["rope_theta"])
    if rope.get("rope_type", "default") != "default" and legacy.get("rope_scaling") is None:
        legacy["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return legacy


STANDARD_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # a tokenizer.json tokenizer in transformers 4 and 5


def _copy_tokenizer_files(tokenizer_dir: Path, out: Path, max_positions: int | None = None) -> None:
    """The tokenizer's files, its tokenizer_config.json naming a standard tokenizer class (loading the tokenizer
    never needs the model's code) and the model's `max_positions` as `model_max_length` (a trained tokenizer says
    1e30: no limit)."""
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out / name)
    config_path = out / "tokenizer_config.json"
    if not config_path.is_file() and not (out / "tokenizer.json").is_file():
        return
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if (out / "tokenizer.json").is_file() and (not config.get("tokenizer_class") or "auto_map" in config):
        config.pop("auto_map", None)
        config["tokenizer_class"] = STANDARD_TOKENIZER_CLASS
    if max_positions:
        config["model_max_length"] = int(max_positions)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
