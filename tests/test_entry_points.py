"""cplm_megatron/entry_points.py: the entry points' bad-input contract (one `error:` line, exit 2; other errors keep
their traceback), and quiet starts (details with --verbose or CPLM_VERBOSE=1)."""
import os

import pytest

from cplm_megatron.entry_points import BAD_INPUT_EXIT_CODE, VERBOSE_ENV, exit_2_on, info, verbose
from cplm_megatron.errors import ConfigError


def test_start_up_details_show_with_the_variable_or_pretrains_flag(monkeypatch, capsys):
    """`info` lines are silent unless CPLM_VERBOSE is set (and not 0); pretrain's -v sets it for the process and
    the processes it starts."""
    from cplm_megatron.pretrain import main

    monkeypatch.setenv(VERBOSE_ENV, "0")  # restored after the test
    info("[compat] detail")
    assert not verbose() and capsys.readouterr().err == ""
    assert main(["--config", "tiny", "--print-config"]) == 0 and os.environ[VERBOSE_ENV] == "0"
    assert main(["--config", "tiny", "--print-config", "-v"]) == 0 and verbose()
    capsys.readouterr()
    info("[compat] detail")
    assert capsys.readouterr().err == "[compat] detail\n"


def test_the_named_errors_are_one_line_and_exit_2_others_propagate(capsys):
    @exit_2_on(ConfigError, FileNotFoundError)
    def main(argv=None):
        if argv == ["bad"]:
            raise ConfigError("train.lr must be >= 0, got -1")
        if argv == ["missing"]:
            raise FileNotFoundError("no checkpoint at runs/x")
        if argv == ["bug"]:
            raise KeyError("a bug")
        return 0

    assert main([]) == 0
    assert main(["bad"]) == BAD_INPUT_EXIT_CODE == 2
    assert capsys.readouterr().err == "error: train.lr must be >= 0, got -1\n"
    assert main(["missing"]) == 2 and "no checkpoint at runs/x" in capsys.readouterr().err
    with pytest.raises(KeyError):
        main(["bug"])
    assert main.__name__ == "main"


def _build_twice(rank: int) -> None:
    """Two tiny models in one process, as an entry point builds them (quiet_known_warnings first)."""
    from cplm_megatron.entry_points import quiet_known_warnings
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.layout import single_process_megatron

    quiet_known_warnings()
    model = load_preset("tiny", num_layers=1)
    with single_process_megatron(model):
        for _ in range(2):
            build_run(model_run(model))


@pytest.mark.mcore  # and so mcore_latest: megatron-core 0.19 logs the deprecation from every GPTModel built
def test_gpt_model_deprecation_is_one_compat_line_per_process():
    """megatron-core >= 0.19 logs 'GPTModel IS DEPRECATED' from every GPTModel built (each PP/VPP chunk, each model
    of a process): an entry point shows it once where verbose, as one `[compat]` info line (which the bad-input
    contract's one `error:` line check leaves aside), and never megatron's own line; 0.16-0.18 say nothing."""
    from importlib import metadata

    from packaging.version import Version

    from tests import harness

    out = harness.run_captured(_build_twice, 1, env={"CPLM_VERBOSE": "1"})  # quiet otherwise: no line at all
    assert out.returncode == 0, out.stderr[-3000:]
    notes = [line for line in out.stderr.splitlines() if "GPTModel" in line]
    deprecated = Version(metadata.version("megatron-core")) >= Version("0.19")
    assert len(notes) == (1 if deprecated else 0), out.stderr[-3000:]
    if deprecated:
        assert notes[0].startswith("[compat] GPTModel is deprecated in megatron-core 0.19"), notes
        assert "IS DEPRECATED" not in out.stderr
