"""The synthetic tasks against a rule-based scorer with exactly known answers, and `val` on a real model."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cplm_megatron.data.synthetic import CopySample, copy_random_sample, copy_sample, passkey_sample
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.runner import evaluate, format_table, parse_tasks
from cplm_megatron.evaluation.tasks import copy, passkey, spamlang, val
from tests.evaluation.induction import InductionScorer

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

VOCAB = 20_000
PASSKEY_VOCAB = 50_000  # no key token recurs in these samples' filler (checked in the test)
CONF = 0.9


def options(**kw) -> EvalOptions:
    return EvalOptions(batch_size=4, limit=8, show_progress=False, **kw)


def test_copy_scores_the_repeat_after_its_first_token():
    opts = options(copy_length=64)
    spans = [copy_sample(i, 64, VOCAB, opts.eval_seed)[0][:32] for i in range(8)]
    assert all(len(set(s.tolist())) == 32 for s in spans)  # distinct span tokens: induction is exact
    result = copy.run(InductionScorer(VOCAB, confidence=CONF), opts)
    assert result.metrics["copy_accuracy"] == 1.0
    assert result.metrics["copy_sequence_accuracy"] == 1.0
    assert result.metrics["copy_accuracy_chance"] == 1 / (VOCAB - 1)  # span tokens uniform over 1..V-1
    # the scorer's fp32 log(CONF) averaged over 256 tokens: ~|log CONF| * 2^-24 per term, ~1e-7
    assert result.metrics["copy_loss"] == pytest.approx(-math.log(CONF), abs=1e-6)
    assert result.details["scored_tokens"] == 8 * (64 - 32)  # positions 32..63 predict the repeat's tokens 2..33
    assert result.metrics["copy_accuracy_one_token_match"] == 1.0  # no span token recurs: one token suffices


def test_copy_random_layout_scores_each_samples_own_repeat():
    """copy_layout=random: the mask follows each sample's repeat (start and length vary), so the induction rule
    is exact there too, and the scored count is the sum of the repeats' lengths less their first tokens."""
    opts = options(copy_length=64, copy_layout="random")
    samples = [copy_random_sample(i, 64, VOCAB, opts.eval_seed) for i in range(8)]
    assert all(len(set(s.tokens.tolist())) == 65 - s.repeat_len for s in samples)  # only the repeat recurs
    assert len({(s.repeat_start, s.repeat_len) for s in samples}) > 4
    result = copy.run(InductionScorer(VOCAB, confidence=CONF), opts)
    assert result.metrics["copy_accuracy"] == 1.0 and result.metrics["copy_sequence_accuracy"] == 1.0
    assert result.details["scored_tokens"] == sum(s.repeat_len - 1 for s in samples)
    assert result.details["layout"] == "random"
    assert result.metrics["copy_accuracy_one_token_match"] == 1.0


def test_one_token_match_splits_ties_and_counts_successors():
    """The one-token-match copier predicts the current token's most frequent earlier successor, ties split."""
    def hits(tokens: list[int], start: int, length: int) -> float:
        return copy.one_token_match_hits(CopySample(torch.tensor(tokens), start, length))

    assert hits([1, 2, 1, 3, 9, 1, 2], 5, 2) == 0.5  # at 5 the 1 was followed by 2 and by 3 once each
    assert hits([1, 2, 1, 2, 1, 3, 9, 1, 2], 7, 2) == 1.0  # 2 twice, 3 once
    assert hits([1, 3, 1, 3, 1, 2, 9, 1, 2], 7, 2) == 0.0  # 3 twice: the right 2 loses
    assert hits([4, 5, 6, 4, 5, 6], 3, 3) == 2.0  # a span of distinct tokens: every scored token


def test_spamlang_counts_position_zero():
    result = spamlang.run(InductionScorer(VOCAB, confidence=CONF), options(spamlang_length=16))
    m = result.metrics
    # a ratio of counts (15/16) in fp64: pytest.approx's default rel 1e-6 is far above its rounding
    assert m["spamlang_accuracy"] == pytest.approx(15 / 16)  # position 0 is uniform (argmax = token 0, wrong)
    assert m["spamlang_accuracy_after_first"] == 1.0
    assert m["spamlang_accuracy_previous_token"] == 1.0  # the trivial copier is right everywhere, position 0 too
    assert "spamlang_accuracy_cache" not in m  # a rule-based scorer has no hidden states for a cache
    # fp32 log-probs (|log p| <= log VOCAB ~ 6) averaged over 16 positions: ~6 * 2^-24 ~ 4e-7 each -> 1e-5; the
    # probabilities themselves are <= 1: 1e-6
    assert m["spamlang_loss"] == pytest.approx((math.log(VOCAB) - 15 * math.log(CONF)) / 16, abs=1e-5)
    assert m["spamlang_target_prob"] == pytest.approx((1 / VOCAB + 15 * CONF) / 16, abs=1e-6)


def test_passkey_grid_finds_every_key_token_but_the_first():
    opts = options(passkey_lengths=(32, 64), passkey_depths=(0.0, 0.5, 1.0))
    for cell, (length, depth) in enumerate([(L, d) for L in (32, 64) for d in (0.0, 0.5, 1.0)]):
        for i in range(8):  # precondition: key tokens are unique in the sample apart from needle/query
            s = passkey_sample(cell * 8 + i, length + 1, depth, PASSKEY_VOCAB, opts.eval_seed, 4)
            key = s.tokens[-4:].tolist()
            assert all(int((s.tokens == k).sum()) == 2 for k in key)
    result = passkey.run(InductionScorer(PASSKEY_VOCAB, confidence=CONF), opts)
    grid = result.details["grid"]
    assert [(c["length"], c["depth"]) for c in grid] == [(L, d) for L in (32, 64) for d in (0.0, 0.5, 1.0)]
    assert all(c["accuracy"] == 0.0 and c["token_accuracy"] == 0.75 and c["first_token_accuracy"] == 0.0
               for c in grid)
    # key tokens 2..4 are copyable bigrams under teacher forcing; the first is the one that needs retrieval
    assert result.metrics == {"passkey_accuracy": 0.0, "passkey_token_accuracy": 0.75,
                              "passkey_first_token_accuracy": 0.0,
                              "passkey_first_token_chance": 1 / (PASSKEY_VOCAB - 3)}


class RetrievalScorer(InductionScorer):
    """Induction that also reads the query marker (2) as the needle's marker (1): it retrieves k_1."""

    def predictions(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().predictions(torch.where(tokens == 2, torch.ones_like(tokens), tokens))


def test_passkey_first_token_accuracy_counts_retrieval():
    opts = options(passkey_lengths=(32,), passkey_depths=(0.5,))
    result = passkey.run(RetrievalScorer(PASSKEY_VOCAB, confidence=CONF), opts)
    assert result.metrics["passkey_first_token_accuracy"] == 1.0 == result.metrics["passkey_accuracy"]


def test_passkey_skips_lengths_beyond_the_model_and_says_so():
    result = passkey.run(InductionScorer(VOCAB, max_length=40), options(passkey_lengths=(32, 64), passkey_depths=(0.5,)))
    assert result.details["lengths"] == [32] and result.details["skipped_lengths"] == [64]
    with pytest.raises(ValueError, match="every passkey length"):
        passkey.run(InductionScorer(VOCAB, max_length=16), options(passkey_lengths=(32,)))


def test_lengths_longer_than_the_model_are_rejected():
    with pytest.raises(ValueError, match="copy_length=128 exceeds the model's max_position_embeddings=64"):
        copy.run(InductionScorer(VOCAB, max_length=64), options(copy_length=128))


def test_runner_table_and_task_names():
    results = evaluate(InductionScorer(VOCAB), ["spamlang", "passkey"], options(passkey_lengths=(32,), spamlang_length=16))
    table = format_table(results)
    assert "spamlang_accuracy" in table and "passkey accuracy" in table and "len 32" in table
    assert parse_tasks("all") == ["val", "copy", "passkey", "spamlang", "gradient"]
    with pytest.raises(ValueError, match="unknown task"):
        parse_tasks("copy,bogus")


@pytest.mark.parametrize("bad, message", [
    ({"batch_size": 0}, "batch_size"), ({"passkey_depths": (1.5,)}, "depths"),
    ({"gradient_source": "text"}, "gradient_source"), ({"copy_layout": "middle"}, "copy_layout"),
])
def test_options_are_validated(bad, message):
    with pytest.raises(ValueError, match=message):
        EvalOptions(**bad).validate()


def test_val_equals_the_models_masked_loss(megatron, packed_val: Path, isolated_streaming):
    """val on packed, document-masked samples = the model's own per-token loss over the same batches (the task's
    sample of 8 spread across the set: tests/evaluation/test_val_sample.py)."""
    scorer = megatron["cplm"]
    opts = options(data=str(packed_val))
    result = val.run(scorer, opts)
    loader = val.open_val_loader([str(packed_val)], 4, True, scorer.vocab_size)
    total, count, documents = 0.0, 0.0, 0
    for batch in val.val_batches(loader, opts):
        documents = max(documents, int(batch["document_ids"].max()) + 1)
        with torch.no_grad():
            loss = scorer.model(**scorer.model_inputs(batch), output="loss")
        total += float((loss * batch["loss_mask"]).sum())
        count += float(batch["loss_mask"].sum())
    assert documents > 1  # rows hold several documents: the document masking matters
    assert result.details["tokens"] == count
    # the task reduces the same fp32 per-token losses in another order (batches, then tokens): ~sqrt(n) * 2^-24
    # relative -> 1e-5; exp() multiplies a relative error by |loss| <~ 8 -> 1e-4 for the perplexity
    assert result.metrics["val_loss"] == pytest.approx(total / count, rel=1e-5)
    assert result.metrics["val_ppl"] == pytest.approx(math.exp(total / count), rel=1e-4)


def test_val_all_scores_every_sample_including_the_last_partial_batch(megatron, packed_val: Path,
                                                                      isolated_streaming):
    """--val-all: every packed sample and every document is scored, also when the batch size does not divide
    the sample count (the last micro-batch used to be dropped)."""
    from cplm_megatron.data.manifest import read_manifest

    manifest = read_manifest(str(packed_val))
    batch = next(b for b in range(3, manifest.samples) if manifest.samples % b)
    opts = EvalOptions(batch_size=batch, limit=1, show_progress=False, data=str(packed_val), val_all=True)
    result = val.run(megatron["baseline"], opts)
    assert result.details["sequences"] == result.details["samples_available"] == manifest.samples
    assert len(result.details["documents"]["ids"]) == manifest.documents
    assert result.details["tokens"] == manifest.tokens - 1  # every token after the first is a label once


def test_val_without_data_names_the_fix():
    with pytest.raises(ValueError, match="pass --data DIR"):
        val.val_paths(InductionScorer(VOCAB), options())


def test_val_lm_loss_is_the_lm_heads_own_cross_entropy(megatron, packed_val: Path, isolated_streaming):
    """val_lm_loss of a CPLM = Megatron's own LM cross entropy (compute_language_model_loss) on the output layer's
    logits; for a baseline it is val_loss."""
    scorer = megatron["cplm"]
    result = val.run(scorer, options(data=str(packed_val), val_all=True))
    assert result.details["sequences"] == result.details["samples_available"]
    model = scorer.model
    loader = val.open_val_loader([str(packed_val)], 4, True, scorer.vocab_size)
    total = count = 0.0
    captured: list = []
    for batch in loader:
        captured.clear()
        handle = model.decoder.register_forward_hook(lambda _m, _a, out: captured.append(out))
        inputs = scorer.model_inputs(batch)
        with torch.no_grad():
            model(**inputs, output="loss")
            handle.remove()
            weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
            logits, _ = model.output_layer(captured[0], weight=weight)
            ce = model.compute_language_model_loss(inputs["labels"], logits)  # [b, s]
        total += float((ce * inputs["loss_mask"]).sum())
        count += float(inputs["loss_mask"].sum())
    # fp32 per-token CE by two implementations (Megatron's vocab-parallel CE vs log_softmax): ~1e-6 relative each
    assert result.metrics["val_lm_loss"] == pytest.approx(total / count, rel=1e-5)
    assert result.metrics["val_lm_loss"] != pytest.approx(result.metrics["val_loss"], rel=1e-4)  # the mixture differs
    base = val.run(megatron["baseline"], options(data=str(packed_val)))
    assert base.metrics["val_lm_loss"] == base.metrics["val_loss"]
