"""Fixtures for the HF model/export tests (helpers live in hf_testing.py)."""

from pathlib import Path

import pytest
from hf_testing import train_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer (300 tokens incl. specials) saved as an HF tokenizer directory."""
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"))
