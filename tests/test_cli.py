"""cplm_megatron/cli.py: the entry points' bad-input contract (one `error:` line, exit 2; other errors keep
their traceback)."""
import pytest

from cplm_megatron.cli import BAD_INPUT_EXIT_CODE, exit_2_on
from cplm_megatron.errors import ConfigError


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
