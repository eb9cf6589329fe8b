"""Fixtures of the evaluation tests: a trained tiny baseline/CPLM pair, their HF exports, scorers.

Imported by tests/evaluation/conftest.py and by tool tests that need a checkpoint (tests/tools).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_fixtures import TinyCorpus, synthetic_tokenizer, write_synthetic_dataset
from tests.evaluation.runs import SEQ_LEN, VOCAB, shared_exports, shared_runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{'baseline': run dir, 'cplm': run dir}, trained once per session (~15-30 s)."""
    return shared_runs(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def hf_exports(runs: dict[str, Path], tiny_corpus: TinyCorpus, tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, Path]:
    """tools/convert_to_hf.py exports of both runs (CPLMForCausalLM / LlamaForCausalLM)."""
    return shared_exports(tmp_path_factory.getbasetemp(), runs, tiny_corpus.tokenizer_dir)


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
