"""The evaluation fixtures (tests/evaluation/fixtures.py) for every test in this directory."""
from tests.evaluation.fixtures import hf, hf_exports, megatron, packed_val, runs  # noqa: F401
