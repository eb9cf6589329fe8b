"""Fixtures of the training tests."""
import pytest


@pytest.fixture
def mounts():
    """A private mount namespace for one test (tests/training/private_mounts.py)."""
    from tests.training.private_mounts import private_mounts

    yield from private_mounts()
