"""The one place that imports mosaicml-streaming (stubbing its vision extras first).

`import streaming` imports `streaming.vision`, which imports torchvision; torchvision's only PyPI
builds are CUDA builds that break beside a CPU torch (measured). We never use the vision
datasets, so an empty stand-in module is registered before the import.
"""
from __future__ import annotations

import sys
import types

if "streaming.vision" not in sys.modules:
    sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")

from streaming import MDSWriter, Stream, StreamingDataset
from streaming.base.dataset import TICK, _ShardState
from streaming.base.storage import CloudDownloader
from streaming.base.util import bytes_to_int
from streaming.base.world import World

__all__ = ["TICK", "CloudDownloader", "bytes_to_int", "MDSWriter", "ShardState", "Stream", "StreamingDataset", "World"]
ShardState = _ShardState
