"""YAML + dotted overrides -> strict config dataclasses (the generic loader)."""
import re

import pytest

from cplm_megatron.config.loader import RECIPE_DIR, apply_overrides, build_dataclass, parse_override, recipe_path
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


def test_yaml_syntax_errors_name_file_line_and_column(tmp_path):
    from cplm_megatron.config.loader import read_yaml

    tabbed = tmp_path / "tab.yaml"
    tabbed.write_text("train:\n  lr: 1e-3\n\titers: 3\n")
    with pytest.raises(ConfigError, match=rf"^{tabbed}:3:1: invalid YAML: .*spaces, not tabs"):
        read_yaml(tabbed)
    unclosed = tmp_path / "bracket.yaml"
    unclosed.write_text("data:\n  streams: [a, b\n")
    with pytest.raises(ConfigError, match=rf"^{unclosed}:\d+:\d+: invalid YAML"):
        read_yaml(unclosed)


def test_a_key_given_twice_is_refused(tmp_path):
    from cplm_megatron.config.loader import read_yaml

    twice = tmp_path / "twice.yaml"
    twice.write_text("train:\n  iters: 3\n  lr: 1e-3\n  iters: 4\n")
    with pytest.raises(ConfigError, match=rf"^{twice}:4:3: key 'iters' is given twice \(first at line 2\)"):
        read_yaml(twice)
    assert read_yaml(_write(tmp_path / "ok.yaml", "a:\n  iters: 3\nb:\n  iters: 4\n")) == {
        "a": {"iters": 3}, "b": {"iters": 4}}  # the same key in two sections is fine


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("override, message", [
    ("train.iters=-5", "train.iters must be >= 1, got -5"),
    ("train.iters=0", "train.iters must be >= 1, got 0"),
    ("train.exit_after_iters=0", "train.exit_after_iters must be >= 1"),
    ("train.micro_batch=0", "train.micro_batch must be >= 1"),
    ("train.log_interval=-1", "train.log_interval must be >= 1"),
    ("train.eval_interval=-2", "train.eval_interval must be >= 0"),
    ("train.lr=-1e-3", "train.lr/min_lr must satisfy"),
    ("checkpoint.interval=-3", "checkpoint.interval must be >= 0"),
    ("checkpoint.keep=0", "checkpoint.keep must be >= 1"),
    ("schedule.warmup_iters=-1", "schedule.warmup_iters must be >= 0"),
    ("optimizer.weight_decay=-0.1", "optimizer.weight_decay must be >= 0"),
    ("optimizer.clip_grad=-1", "optimizer.clip_grad must be >= 0"),
    ("optimizer.beta2=1.5", "optimizer.beta2 must be in [0, 1)"),
    ("run.seed=-1", "run.seed must be in [0, 2**32)"),
    ("data.num_workers=-1", "data.num_workers must be >= 0"),
])
def test_numeric_keys_out_of_range_are_config_errors(override, message):
    """Checked when the config is built, with the other config errors: before anything is written."""
    from cplm_megatron.run_config import load_run_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_run_config("configs/tiny.yaml", [override])
    with pytest.raises(ConfigError, match="train.tokens must be >= 1, got -4096"):
        load_run_config("configs/tiny.yaml", ["train.tokens=-4096"])


def test_recipe_path_finds_a_shipped_recipe_by_name(tmp_path, monkeypatch):
    """`--config tiny` is the shipped configs/tiny.yaml; a file that exists (even one named like a recipe)
    and anything else are left as given, for read_yaml to read or to name as missing."""
    assert recipe_path("tiny") == str(RECIPE_DIR / "tiny.yaml") and (RECIPE_DIR / "tiny.yaml").is_file()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").write_text("train: {}\n")
    assert recipe_path("tiny") == "tiny"  # the user's file wins
    assert recipe_path("no_such_recipe") == "no_such_recipe"
    assert recipe_path("configs/tiny.yaml") == "configs/tiny.yaml"


def test_a_missing_recipe_lists_the_shipped_ones_and_a_non_utf8_one_is_one_line(tmp_path):
    from cplm_megatron.config.loader import read_yaml

    with pytest.raises(ConfigError, match=r"config file not found: configs/tiny_llama\.yaml; did you mean --config tiny\? "
                                          r"\(shipped recipes, by name: .*smollm2_135m.*tiny_qwen3\)"):
        read_yaml("configs/tiny_llama.yaml")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("run:\n  name: café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not a UTF-8 text file \(byte 0xe9 at offset 16\)") as err:
        read_yaml(latin1)
    assert "\n" not in str(err.value)
