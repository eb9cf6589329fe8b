"""The one place that imports mosaicml-streaming (stubbing its dataset extras first).

`import streaming` imports `streaming.vision`, which imports torchvision; torchvision's only PyPI
builds are CUDA builds that break beside a CPU torch (measured). `streaming.text` and
`streaming.multimodal` import transformers' tokenizer registry (~0.3 s in every training process). We use
none of these ready-made datasets, so empty stand-in modules are registered before the import.
"""
from __future__ import annotations

import sys
import types

for _extra in ("streaming.vision", "streaming.text", "streaming.multimodal"):
    if _extra not in sys.modules:
        sys.modules[_extra] = types.ModuleType(_extra)

from streaming import MDSWriter, Stream, StreamingDataset
from streaming.base.dataset import TICK, _ShardState
from streaming.base.storage import CloudDownloader
from streaming.base.util import bytes_to_int
from streaming.base.world import World

__all__ = ["TICK", "CloudDownloader", "bytes_to_int", "MDSWriter", "ShardState", "Stream", "StreamingDataset", "World"]
ShardState = _ShardState
