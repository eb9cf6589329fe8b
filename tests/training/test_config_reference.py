"""docs/config-reference.md is generated from the config dataclasses and fails this test when stale: a key added
to a section without regenerating the page (or without a description) is caught; `--print-config --describe`
prints the same descriptions as valid YAML."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cplm_megatron.errors import ConfigError
from cplm_megatron.run_config import LoggingConfig, RunConfig, load_run_config
from cplm_megatron.training.config_reference import PAGE, describe, reference_keys, render, stale_lines

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_the_generated_one():
    committed, generated = (REPO / PAGE).read_text(), render()
    assert committed == generated, ("docs/config-reference.md is stale: run `python tools/config_reference.py`; "
                                    f"first differences: {stale_lines(committed, generated)[:3]}")
    keys = [k.key for section in reference_keys().values() for k in section]
    assert len(keys) == len(set(keys)) > 100 and "train.lr" in keys and "data.streams[].proportion" in keys


@dataclass
class _LoggingWithNewKey(LoggingConfig):
    new_key: int = 3


@dataclass
class _LoggingWithCommentedKey(LoggingConfig):
    new_key: int = 3  # a key added with a comment on its line


@dataclass
class _RunWithNewKey(RunConfig):
    logging: LoggingConfig = field(default_factory=_LoggingWithNewKey)


@dataclass
class _RunWithCommentedKey(RunConfig):
    logging: LoggingConfig = field(default_factory=_LoggingWithCommentedKey)


def test_a_key_added_without_a_description_or_without_regenerating_is_caught():
    with pytest.raises(ConfigError, match=r"logging\.new_key has no description"):
        render(_RunWithNewKey)
    generated = render(_RunWithCommentedKey)  # described by its comment: rendered, and the committed page is stale
    assert "| `logging.new_key` | int | `3` | a key added with a comment on its line |" in generated
    assert generated != (REPO / PAGE).read_text()


def test_print_config_describe_is_the_resolved_config_as_yaml_with_meanings(capsys):
    from cplm_megatron.pretrain import main

    assert main(["--config", str(REPO / "configs/tiny.yaml"), "--set", "train.lr=1e-3", "--print-config",
                 "--describe"]) == 0
    out = capsys.readouterr().out
    cfg = load_run_config(str(REPO / "configs/tiny.yaml"), ["train.lr=1e-3"])
    assert yaml.safe_load(out) == yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    assert "  lr: 0.001  # peak learning rate (after warm-up)" in out
    assert out == describe(cfg) + "\n"
