"""Shared command-line niceties for the entry points (pretrain, tools)."""
from __future__ import annotations

import warnings

# Benign on machines without Apex/Transformer Engine (CPU, or a GPU image without TE): megatron-core
# announces its torch fallbacks at import time, once per module, in every process.
_EXPECTED = (
    r".*(Apex|Transformer Engine).* (is|are) not installed.*",
    r".*Transformer Engine and Apex are not installed.*",
    r"full scope is deprecated.*",  # megatron-core's own TransformerConfig default (cuda graphs, unused)
)


def quiet_known_warnings() -> None:
    """Hide megatron-core's expected 'Apex/TE not installed' warnings (call before importing megatron)."""
    for pattern in _EXPECTED:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
