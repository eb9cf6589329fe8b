"""Weight mapping between full (unsharded) Megatron-Core tensors and Hugging Face state dicts.

Megatron side: the global tensors of a torch_dist checkpoint by sharded key, transformer layers
stacked on dim 0 (what `load_plain_tensors` returns). These are layout-independent:
- `linear_qkv.weight` [(H + 2G)·d, h] is grouped per query group g: [the H/G query heads of g; k_g; v_g];
- `linear_fc1.weight` of a gated MLP is [gate; up] over the FULL ffn width (Megatron's swiglu sharded
  factory stores each TP shard's [gate_i; up_i] halves at their global offsets);
- the embedding / output layer have `padded_vocab_size` rows: padded rows are dropped on export and
  zero-filled on import. (Megatron's softmax also covers the padded rows, HF's only the real ones;
  the distributions agree when the padded logits carry no mass.)
HF side: LlamaForCausalLM / CPLMForCausalLM names, or GPT2LMHeadModel (Conv1D weights are [in, out]).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from cplm_megatron.hf.config_mapping import ConversionError, check_exportable
from cplm_megatron.model.config import ModelConfig
from cplm_megatron.model.copy_head import CopyHeadConfig
from cplm_megatron.model.mixing import mixing_rule

EMBEDDING = "embedding.word_embeddings.weight"
POSITIONS = "embedding.position_embeddings.weight"
OUTPUT_LAYER = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm."
INPUT_NORM = "decoder.layers.self_attention.linear_qkv.layer_norm_"
QKV = "decoder.layers.self_attention.linear_qkv."
PROJ = "decoder.layers.self_attention.linear_proj."
MLP_NORM = "decoder.layers.mlp.linear_fc1.layer_norm_"
FC1 = "decoder.layers.mlp.linear_fc1."
FC2 = "decoder.layers.mlp.linear_fc2."
COPY_HEAD = "copy_head."


def copy_head_keys(copy_head: CopyHeadConfig) -> list[str]:
    """Parameter names of the copy head (identical on both sides)."""
    names = ["q_proj.weight", "k_proj.weight", "gate.weight", "gate.bias"]
    if copy_head.qk_norm:
        names += ["q_norm.weight", "k_norm.weight"]
    return [COPY_HEAD + name for name in names]


def megatron_keys(model: ModelConfig, copy_head: CopyHeadConfig | None) -> list[str]:
    """The Megatron tensors a checkpoint of this model holds (optimizer state aside)."""
    suffixes = ["weight", "bias"] if model.normalization == "LayerNorm" else ["weight"]
    linear = ["weight", "bias"] if model.add_bias_linear else ["weight"]
    keys = [EMBEDDING]
    if model.position_embedding == "learned_absolute":
        keys.append(POSITIONS)
    keys += [INPUT_NORM + s for s in suffixes] + [MLP_NORM + s for s in suffixes] + [FINAL_NORM + s for s in suffixes]
    keys += [prefix + s for prefix in (QKV, PROJ, FC1, FC2) for s in linear]
    if not model.tie_embeddings:
        keys.append(OUTPUT_LAYER)
    if copy_head is not None:
        keys += copy_head_keys(copy_head)
    return keys


def _checked(tensors: Mapping[str, torch.Tensor], key: str, shape: tuple[int | None, ...]) -> torch.Tensor:
    """tensors[key], which must have `shape` (None: any size); errors name the key and both shapes."""
    if key not in tensors:
        raise ConversionError(f"missing tensor {key}")
    tensor = tensors[key]
    if tensor.dim() != len(shape) or any(want is not None and got != want for got, want in zip(tensor.shape, shape)):
        wanted = ["*" if s is None else s for s in shape]
        raise ConversionError(f"{key} has shape {list(tensor.shape)} but the config implies {wanted}")
    return tensor


def _qkv_rows(model: ModelConfig) -> int:
    return (model.num_attention_heads + 2 * model.kv_heads) * model.head_dim


def split_qkv(qkv: torch.Tensor, model: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped Megatron QKV rows [(H + 2G)·d, ...] -> q [H·d, ...], k [G·d, ...], v [G·d, ...]."""
    groups, per_group, d = model.kv_heads, model.num_attention_heads // model.kv_heads, model.head_dim
    grouped = qkv.reshape(groups, per_group + 2, d, *qkv.shape[1:])
    rest = qkv.shape[1:]
    return (grouped[:, :per_group].reshape(groups * per_group * d, *rest),
            grouped[:, per_group].reshape(groups * d, *rest),
            grouped[:, per_group + 1].reshape(groups * d, *rest))


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model: ModelConfig) -> torch.Tensor:
    """Inverse of `split_qkv`."""
    groups, per_group, d = model.kv_heads, model.num_attention_heads // model.kv_heads, model.head_dim
    rest = q.shape[1:]
    grouped = torch.cat([q.reshape(groups, per_group, d, *rest), k.reshape(groups, 1, d, *rest),
                         v.reshape(groups, 1, d, *rest)], dim=1)
    return grouped.reshape(_qkv_rows(model), *rest)


def megatron_to_hf(
    tensors: Mapping[str, torch.Tensor], model: ModelConfig, copy_head: CopyHeadConfig | None
) -> dict[str, torch.Tensor]:
    """HF state dict (Llama/CPLM or GPT-2 names) of a Megatron checkpoint's full tensors."""
    check_exportable(model, copy_head)
    if model.family == "gpt2":
        return _gpt2_from_megatron(tensors, model)
    state = _llama_from_megatron(tensors, model)
    if copy_head is not None:
        state.update(_copy_head_tensors(tensors, model, copy_head))
    return state


def _vocab_rows(tensors: Mapping[str, torch.Tensor], key: str, model: ModelConfig) -> torch.Tensor:
    return _checked(tensors, key, (model.padded_vocab_size, model.hidden_size))[: model.vocab_size]


def _copy_head_tensors(
    tensors: Mapping[str, torch.Tensor], model: ModelConfig, copy_head: CopyHeadConfig
) -> dict[str, torch.Tensor]:
    width = copy_head.heads * copy_head.head_dim
    rows = mixing_rule(copy_head.mixing).gate_rows(copy_head.heads)  # 1, or H_c sentinels (mixing: sentinel)
    shapes = {"q_proj.weight": (width, model.hidden_size), "k_proj.weight": (width, model.hidden_size),
              "gate.weight": (rows, model.hidden_size), "gate.bias": (rows,),
              "q_norm.weight": (copy_head.head_dim,), "k_norm.weight": (copy_head.head_dim,)}
    return {key: _checked(tensors, key, shapes[key.removeprefix(COPY_HEAD)]) for key in copy_head_keys(copy_head)}


def _llama_from_megatron(tensors: Mapping[str, torch.Tensor], model: ModelConfig) -> dict[str, torch.Tensor]:
    n, h, f = model.num_layers, model.hidden_size, model.ffn_hidden_size
    attn_width = model.num_attention_heads * model.head_dim
    state = {"model.embed_tokens.weight": _vocab_rows(tensors, EMBEDDING, model),
             "model.norm.weight": _checked(tensors, FINAL_NORM + "weight", (h,))}
    if not model.tie_embeddings:
        state["lm_head.weight"] = _vocab_rows(tensors, OUTPUT_LAYER, model)
    input_norm = _checked(tensors, INPUT_NORM + "weight", (n, h))
    mlp_norm = _checked(tensors, MLP_NORM + "weight", (n, h))
    qkv = _checked(tensors, QKV + "weight", (n, _qkv_rows(model), h))
    proj = _checked(tensors, PROJ + "weight", (n, h, attn_width))
    fc1 = _checked(tensors, FC1 + "weight", (n, 2 * f, h))
    fc2 = _checked(tensors, FC2 + "weight", (n, h, f))
    for i in range(n):
        prefix = f"model.layers.{i}."
        q, k, v = split_qkv(qkv[i], model)
        state.update({
            prefix + "input_layernorm.weight": input_norm[i],
            prefix + "self_attn.q_proj.weight": q,
            prefix + "self_attn.k_proj.weight": k,
            prefix + "self_attn.v_proj.weight": v,
            prefix + "self_attn.o_proj.weight": proj[i],
            prefix + "post_attention_layernorm.weight": mlp_norm[i],
            prefix + "mlp.gate_proj.weight": fc1[i, :f],
            prefix + "mlp.up_proj.weight": fc1[i, f:],
            prefix + "mlp.down_proj.weight": fc2[i],
        })
    return state


def _gpt2_from_megatron(tensors: Mapping[str, torch.Tensor], model: ModelConfig) -> dict[str, torch.Tensor]:
    n, h, f = model.num_layers, model.hidden_size, model.ffn_hidden_size
    state = {"transformer.wte.weight": _vocab_rows(tensors, EMBEDDING, model),
             "transformer.wpe.weight": _checked(tensors, POSITIONS, (None, h)),
             "transformer.ln_f.weight": _checked(tensors, FINAL_NORM + "weight", (h,)),
             "transformer.ln_f.bias": _checked(tensors, FINAL_NORM + "bias", (h,))}
    if not model.tie_embeddings:
        state["lm_head.weight"] = _vocab_rows(tensors, OUTPUT_LAYER, model)
    layer = {
        "ln_1.weight": _checked(tensors, INPUT_NORM + "weight", (n, h)),
        "ln_1.bias": _checked(tensors, INPUT_NORM + "bias", (n, h)),
        "ln_2.weight": _checked(tensors, MLP_NORM + "weight", (n, h)),
        "ln_2.bias": _checked(tensors, MLP_NORM + "bias", (n, h)),
        # Conv1D stores [in, out]: transpose every linear weight
        "attn.c_proj.weight": _checked(tensors, PROJ + "weight", (n, h, h)).transpose(1, 2),
        "attn.c_proj.bias": _checked(tensors, PROJ + "bias", (n, h)),
        "mlp.c_fc.weight": _checked(tensors, FC1 + "weight", (n, f, h)).transpose(1, 2),
        "mlp.c_fc.bias": _checked(tensors, FC1 + "bias", (n, f)),
        "mlp.c_proj.weight": _checked(tensors, FC2 + "weight", (n, h, f)).transpose(1, 2),
        "mlp.c_proj.bias": _checked(tensors, FC2 + "bias", (n, h)),
    }
    qkv_weight = _checked(tensors, QKV + "weight", (n, 3 * h, h))
    qkv_bias = _checked(tensors, QKV + "bias", (n, 3 * h))
    for i in range(n):
        prefix = f"transformer.h.{i}."
        state.update({prefix + name: stacked[i] for name, stacked in layer.items()})
        # Megatron groups [q_j; k_j; v_j] per head j; HF's c_attn output is [q; k; v] over all heads.
        state[prefix + "attn.c_attn.weight"] = torch.cat(split_qkv(qkv_weight[i], model)).t()
        state[prefix + "attn.c_attn.bias"] = torch.cat(split_qkv(qkv_bias[i], model))
    return state


# HF tensors that carry no weights (non-persistent buffers saved by old transformers versions).
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_to_megatron(
    state: Mapping[str, torch.Tensor], model: ModelConfig, copy_head: CopyHeadConfig | None
) -> dict[str, torch.Tensor]:
    """Full Megatron tensors of a Llama-family HF state dict.

    With `copy_head`, the state's `copy_head.*` tensors are taken (an HF CPLM checkpoint); without,
    any `copy_head.*` tensors are dropped. A tied checkpoint's `lm_head.weight` is ignored.
    """
    check_exportable(model, None)
    if model.family != "llama":
        raise ConversionError(f"import supports the llama family only, got model.family={model.family!r}")
    n, h, f = model.num_layers, model.hidden_size, model.ffn_hidden_size
    kv_width, attn_width = model.kv_heads * model.head_dim, model.num_attention_heads * model.head_dim
    used: set[str] = set()

    def take(key: str, shape: tuple[int, ...]) -> torch.Tensor:
        used.add(key)
        return _checked(state, key, shape)

    def stacked(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.stack([take(f"model.layers.{i}.{name}", shape) for i in range(n)])

    def padded_vocab(key: str) -> torch.Tensor:
        rows = take(key, (model.vocab_size, h))
        return torch.cat([rows, rows.new_zeros(model.padded_vocab_size - model.vocab_size, h)])

    q = stacked("self_attn.q_proj.weight", (attn_width, h))
    k = stacked("self_attn.k_proj.weight", (kv_width, h))
    v = stacked("self_attn.v_proj.weight", (kv_width, h))
    tensors = {
        EMBEDDING: padded_vocab("model.embed_tokens.weight"),
        INPUT_NORM + "weight": stacked("input_layernorm.weight", (h,)),
        QKV + "weight": torch.stack([merge_qkv(q[i], k[i], v[i], model) for i in range(n)]),
        PROJ + "weight": stacked("self_attn.o_proj.weight", (h, attn_width)),
        MLP_NORM + "weight": stacked("post_attention_layernorm.weight", (h,)),
        FC1 + "weight": torch.cat([stacked("mlp.gate_proj.weight", (f, h)), stacked("mlp.up_proj.weight", (f, h))],
                                  dim=1),
        FC2 + "weight": stacked("mlp.down_proj.weight", (h, f)),
        FINAL_NORM + "weight": take("model.norm.weight", (h,)),
    }
    if model.tie_embeddings:
        used.add("lm_head.weight")
    else:
        tensors[OUTPUT_LAYER] = padded_vocab("lm_head.weight")
    if copy_head is not None:
        head = _copy_head_tensors(state, model, copy_head)
        used.update(head)
        tensors.update(head)
    else:
        used.update(key for key in state if key.startswith(COPY_HEAD))
    unexpected = sorted(key for key in state if key not in used and not key.endswith(_IGNORED_HF_SUFFIXES))
    if unexpected:
        raise ConversionError(f"HF state dict has tensors the Llama mapping does not know: {unexpected[:10]}"
                              + (f" ... and {len(unexpected) - 10} more" if len(unexpected) > 10 else ""))
    return tensors
