"""The in-training probe (evaluation/probes.py) against the evaluator: the copy accuracy the reference run logged
at its last iteration is what `tasks/copy.py` computes from the checkpoint saved there (another code path: the
scorer's model loaded from disk, the evaluator's batching)."""
from __future__ import annotations

import pytest

from cplm_megatron.evaluation.options import EvalOptions
from tests.trained_runs import PROBES, REFERENCE_ITERS
from tests.training import pretrain_utils as pu


@pytest.mark.mcore
@pytest.mark.slow
def test_probe_copy_accuracy_is_the_copy_tasks_on_the_saved_checkpoint(reference_run, isolated_streaming):
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron
    from cplm_megatron.evaluation.tasks import copy

    logged = [r for r in pu.metrics(reference_run["dir"]) if "probe_copy_accuracy" in r][-1]
    assert logged["iteration"] == REFERENCE_ITERS
    options = EvalOptions(limit=PROBES["train.probe_sequences"], copy_length=PROBES["train.probe_copy_length"],
                          batch_size=3, show_progress=False)
    with single_process_megatron():
        scorer = MegatronScorer.load(reference_run["dir"])
        assert scorer.iteration == REFERENCE_ITERS
        result = copy.run(scorer, options)
    assert result.details["scored_tokens"] == logged["probe_copy_tokens"]
    assert result.metrics["copy_accuracy"] == logged["probe_copy_accuracy"]
    assert result.metrics["copy_accuracy_chance"] == logged["probe_copy_chance"]


@pytest.mark.parametrize("overrides, message", [
    (["train.probe_interval=5", "parallel.pp=2", "model.num_layers=4"], "train.probe_interval needs parallel.pp=1"),
    (["train.probe_interval=-1"], "train.probe_interval must be >= 0"),
    (["train.probe_interval=5", "train.probe_copy_length=4"], "train.probe_copy_length >= 8"),
])
def test_probe_settings_are_checked(overrides, message):
    from cplm_megatron.errors import ConfigError
    from cplm_megatron.run_config import load_run_config

    with pytest.raises(ConfigError, match=message):
        load_run_config("tiny", overrides).validate()
