"""The evaluation fixtures (tests/evaluation/fixtures.py) for every test in this directory."""
from tests.evaluation.fixtures import hf, megatron  # noqa: F401
