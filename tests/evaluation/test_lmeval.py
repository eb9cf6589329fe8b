"""The lm-eval pass-through on an HF export: built-in local tasks, results read back."""
from __future__ import annotations

from pathlib import Path

import pytest

from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.tasks import lmeval

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


def test_builtin_task_documents():
    docs = lmeval.copy_words_docs(5, seed=1)
    for doc in docs:
        words = doc["context"].split(". ")
        assert words[0].split()[:-1] == words[1].split()  # the repeat stops one word short
        assert doc["choices"][doc["label"]] == words[0].split()[-1]
    (gen,) = lmeval.passkey_lines_docs(1, seed=1)
    assert f"key:{gen['target']}\n" in gen["prompt"] and gen["prompt"].endswith("\nkey:")


def test_lm_eval_needs_an_hf_export(megatron):
    with pytest.raises(ValueError, match="runs on HF exports"):
        lmeval.run(megatron["cplm"], EvalOptions(show_progress=False))


@pytest.mark.slow
def test_lm_eval_runs_the_builtin_tasks_on_the_export(hf):
    result = lmeval.run(hf["cplm"], EvalOptions(limit=3, batch_size=2, show_progress=False))
    assert set(result.details["tasks"]) == {"cplm_copy_words", "cplm_passkey_lines"}
    assert 0.0 <= result.metrics["cplm_copy_words/acc"] <= 1.0
    assert 0.0 <= result.metrics["cplm_passkey_lines/exact_match"] <= 1.0
    assert result.details["results"]["cplm_copy_words"]["acc"] == result.metrics["cplm_copy_words/acc"]


def test_lm_eval_results_are_read_from_the_output(tmp_path: Path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "results_2026.json").write_text(
        '{"results": {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1}}}')
    assert lmeval.read_results(tmp_path) == {"t": {"acc": 0.5}}
