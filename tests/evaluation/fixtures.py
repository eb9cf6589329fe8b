"""Fixtures of the evaluation tests: scorers of the session's trained pair and its HF exports (`runs`,
`hf_exports`: tests/trained_runs.py). Imported by tests/evaluation/conftest.py."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def megatron(runs: dict[str, Path]):
    """{'baseline': MegatronScorer, 'cplm': MegatronScorer} of the last checkpoints (one process group). A module
    fixture builds its models before any function fixture: it applies the megatron-core patch layer itself, as an entry point."""
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron
    from cplm_megatron.parallel.megatron_patches import apply_compat

    apply_compat()
    with single_process_megatron():
        yield {name: MegatronScorer.load(run) for name, run in runs.items()}


@pytest.fixture(scope="module")
def hf(hf_exports: dict[str, Path]):
    """{'baseline': HFScorer, 'cplm': HFScorer} of the exports."""
    from cplm_megatron.evaluation.scorers import HFScorer

    return {name: HFScorer.load(path) for name, path in hf_exports.items()}
