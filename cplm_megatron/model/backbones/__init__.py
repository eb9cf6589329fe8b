"""The backbone registry: `model.family` -> its `BackboneSpec` (base.py).

Every module of this package that defines `SPEC` is a family (llama.py, gpt2.py, qwen3.py): adding a backbone
is one module here plus presets in configs/models/. Nothing else branches on the family name.
"""
from __future__ import annotations

import pkgutil
from functools import lru_cache
from importlib import import_module

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.backbones.base import BackboneSpec


@lru_cache(maxsize=1)
def registry() -> dict[str, BackboneSpec]:
    """family -> spec, from every module of this package that defines SPEC."""
    specs: dict[str, BackboneSpec] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        spec = getattr(import_module(f"{__name__}.{module}"), "SPEC", None)
        if isinstance(spec, BackboneSpec):
            specs[spec.family] = spec
    return specs


def known_families() -> list[str]:
    """The registered family names, sorted."""
    return sorted(registry())


def backbone(family: str) -> BackboneSpec:
    """The spec of `family`; an unknown one is one ConfigError line naming the known families."""
    spec = registry().get(family)
    if spec is None:
        raise ConfigError(f"unknown model.family {family!r}; known families: {', '.join(known_families())}")
    return spec


def importer(model_type: str | None) -> BackboneSpec | None:
    """The family convert_from_hf reads an HF config of `model_type` as (None: no family does)."""
    return next((spec for spec in registry().values() if model_type in spec.hf_model_types), None)


def importable_model_types() -> list[str]:
    """Every HF model_type some family imports."""
    return [t for family in known_families() for t in registry()[family].hf_model_types]
