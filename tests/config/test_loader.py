"""YAML + dotted overrides -> strict config dataclasses (the generic loader)."""
import pytest

from cplm_megatron.config.loader import apply_overrides, build_dataclass, parse_override
from cplm_megatron.errors import ConfigError
from cplm_megatron.parallel.config import ParallelConfig


def test_overrides_nest_and_values_parse_as_yaml():
    tree = apply_overrides({}, ["train.lr=3e-4", "parallel.tp=2", "parallel.sp=true", "run.dir=runs/x"])
    assert tree == {"train": {"lr": "3e-4"}, "parallel": {"tp": 2, "sp": True}, "run": {"dir": "runs/x"}}
    assert build_dataclass(ParallelConfig, tree["parallel"], "parallel").sp is True
    with pytest.raises(ConfigError, match=r"unknown config key 'parallel\.tpp'.*did you mean 'parallel\.tp'"):
        build_dataclass(ParallelConfig, {"tpp": 2}, "parallel")


def test_parse_override_requires_equals():
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        parse_override("train.iters")
