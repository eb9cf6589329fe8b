"""Fixtures of the evaluation tests: scorers of the session's trained pair and its HF exports (`runs`,
`hf_exports`: tests/trained_runs.py), a packed validation set. Imported by tests/evaluation/conftest.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_fixtures import synthetic_tokenizer, write_synthetic_dataset
from tests.evaluation.runs import SEQ_LEN, VOCAB


@pytest.fixture(scope="module")
def megatron(runs: dict[str, Path]):
    """{'baseline': MegatronScorer, 'cplm': MegatronScorer} of the last checkpoints (one process group)."""
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron

    with single_process_megatron():
        yield {name: MegatronScorer.load(run) for name, run in runs.items()}


@pytest.fixture(scope="module")
def hf(hf_exports: dict[str, Path]):
    """{'baseline': HFScorer, 'cplm': HFScorer} of the exports."""
    from cplm_megatron.evaluation.scorers import HFScorer

    return {name: HFScorer.load(path) for name, path in hf_exports.items()}


@pytest.fixture(scope="session")
def packed_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared dataset of short random documents (5-40 tokens), packed several to a 64-token sample."""
    import torch

    g = torch.Generator().manual_seed(7)
    docs = [torch.randint(1, VOCAB, (int(torch.randint(5, 41, (1,), generator=g)),), generator=g).tolist()
            for _ in range(80)]
    path = tmp_path_factory.mktemp("packed-val")
    write_synthetic_dataset(path, docs, SEQ_LEN, synthetic_tokenizer(VOCAB))
    return path
