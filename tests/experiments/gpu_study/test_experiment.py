"""The GPU study is a registered experiment: found by the registry's scan, with its own command line and plan."""
from __future__ import annotations

from pathlib import Path

import pytest

from cplm_megatron.experiments import registry
from cplm_megatron.experiments.gpu_study.experiment import GpuStudySettings, experiments_main
from cplm_megatron.experiments.gpu_study.sizes import GPU, TINY


def test_the_registry_finds_the_gpu_study(tmp_path: Path):
    spec = registry.registry(rescan=True)["gpu_study"]
    assert spec.package == "cplm_megatron.experiments.gpu_study" and spec.main is experiments_main
    assert spec.settings().sizes is GPU and spec.settings.smoke().sizes is TINY and spec.settings().budget == 200
    ctx = registry.Context(tmp_path)
    assert spec.plan(GpuStudySettings(), ctx) == [str(tmp_path / "runs" / "study_cplm"),
                                                  str(tmp_path / "runs" / "study_baseline")]
    with pytest.raises(FileNotFoundError, match="study.json is missing: run the study first"):
        spec.report(GpuStudySettings(), ctx)
