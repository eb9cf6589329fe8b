"""Hugging Face config for Copy-Paste Language Models: the backbone's config fields plus the copy-head fields.

Self-contained on purpose: this file is copied into every exported checkpoint directory and loaded
there with ``trust_remote_code=True``, so it may import only ``transformers``.
"""

from transformers import AutoConfig, LlamaConfig

# Fields of a backbone config that describe the file, not the decoder (never copied from the backbone's defaults).
_NOT_BACKBONE_FIELDS = ("model_type", "transformers_version", "architectures", "auto_map")


class CPLMConfig(LlamaConfig):
    """A decoder's config + Copy-Paste head: ``copy_heads`` x ``copy_head_dim`` query/key heads and a gate.

    ``cplm_backbone``: the transformers ``model_type`` of the decoder (``llama``, the default and what exports
    without the field hold; ``qwen3``, ...). For another backbone than Llama the config holds that family's fields
    with its defaults and derived values (e.g. Qwen3's ``layer_types``), read through ``AutoConfig.for_model``, so
    the family's own decoder (``Qwen3Model``) builds from it; the class stays a ``LlamaConfig`` for old exports.

    ``copy_mixing``: the mixing variant (``mixing.py``: gate, constant, sentinel). ``copy_eod_token_id``: the
    end-of-document id (default: ``eos_token_id``); with ``copy_reset_at_eod`` (default on) copy
    candidates never cross it, as in training, where candidates stay inside a packed document.
    """

    model_type = "cplm"

    # An explicit __init__ (not dataclass fields) keeps the class valid on transformers 4.x, where
    # configs are plain classes, and 5.x, where configs are dataclasses that honour a custom __init__.
    def __init__(
        self,
        copy_heads: int = 4,
        copy_head_dim: int = 64,
        copy_qk_norm: bool = False,
        copy_norm_eps: float = 1e-5,
        copy_gate_bias_init: float = -2.0,
        copy_mixing: str = "gate",
        copy_eod_token_id: int | None = None,
        copy_reset_at_eod: bool = True,
        cplm_backbone: str = "llama",
        **kwargs,
    ) -> None:
        if not (isinstance(copy_heads, int) and copy_heads > 0):
            raise ValueError(f"CPLMConfig: copy_heads must be a positive int, got {copy_heads!r}")
        if not (isinstance(copy_head_dim, int) and copy_head_dim > 0):
            raise ValueError(f"CPLMConfig: copy_head_dim must be a positive int, got {copy_head_dim!r}")
        if not copy_norm_eps > 0:
            raise ValueError(f"CPLMConfig: copy_norm_eps must be > 0, got {copy_norm_eps!r}")
        self.copy_heads = copy_heads
        self.copy_head_dim = copy_head_dim
        self.copy_qk_norm = bool(copy_qk_norm)
        self.copy_norm_eps = float(copy_norm_eps)
        self.copy_gate_bias_init = float(copy_gate_bias_init)
        if not (isinstance(copy_mixing, str) and copy_mixing):
            raise ValueError(f"CPLMConfig: copy_mixing must be a mixing variant name, got {copy_mixing!r}")
        self.copy_mixing = copy_mixing
        if copy_eod_token_id is None and isinstance(kwargs.get("eos_token_id"), int):
            copy_eod_token_id = kwargs["eos_token_id"]
        if copy_eod_token_id is not None and not (isinstance(copy_eod_token_id, int) and copy_eod_token_id >= 0):
            raise ValueError(f"CPLMConfig: copy_eod_token_id must be a token id (int >= 0) or None, "
                             f"got {copy_eod_token_id!r}")
        self.copy_eod_token_id = copy_eod_token_id
        self.copy_reset_at_eod = bool(copy_reset_at_eod)
        if not (isinstance(cplm_backbone, str) and cplm_backbone):
            raise ValueError(f"CPLMConfig: cplm_backbone must be a transformers model_type, got {cplm_backbone!r}")
        self.cplm_backbone = cplm_backbone
        if cplm_backbone != "llama":
            kwargs = backbone_fields(cplm_backbone, kwargs)
        super().__init__(**kwargs)


def backbone_fields(model_type: str, fields: dict) -> dict:
    """`fields` completed with the defaults and derived values of `model_type`'s config class."""
    try:
        base = AutoConfig.for_model(model_type, **{k: v for k, v in fields.items() if k not in _NOT_BACKBONE_FIELDS})
    except ValueError as err:
        raise ValueError(f"CPLMConfig: cplm_backbone={model_type!r} is not a model type transformers knows: {err}") \
            from err
    completed = {k: v for k, v in base.to_dict().items() if k not in _NOT_BACKBONE_FIELDS}
    return {**fields, **completed}
