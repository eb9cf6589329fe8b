"""`data.repeat_span_share` (cplm_megatron/data/repeated_spans.py): which samples change, where, and that the
training loader applies it while validation stays as prepared."""
from __future__ import annotations

import numpy as np
import pytest

from cplm_megatron.data.batch import collate_packed_samples
from cplm_megatron.data.repeated_spans import longest_segment, repeat_span

EOD = 0


def window(n: int = 257, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 4096, n)


def test_a_span_of_the_sample_recurs_later_and_nothing_else_changes():
    w = window()
    out, change = repeat_span(w, np.array([0]), len(w), EOD, share=1.0, seed=3)
    source, repeat, span = change
    assert len(w) // 8 <= span <= len(w) // 2 and source + span <= repeat and repeat + span <= len(w)
    assert (out[repeat:repeat + span] == w[source:source + span]).all()
    outside = np.ones(len(w), bool)
    outside[repeat:repeat + span] = False
    assert (out[outside] == w[outside]).all() and (w == window()).all()  # the input is not modified


def test_the_choice_is_a_function_of_the_tokens_and_the_seed():
    w = window()
    first = repeat_span(w, np.array([0]), len(w), EOD, 1.0, seed=3)
    assert repeat_span(w.copy(), np.array([0]), len(w), EOD, 1.0, seed=3)[1] == first[1]
    assert repeat_span(w, np.array([0]), len(w), EOD, 1.0, seed=4)[1] != first[1]


def test_the_share_of_changed_samples_is_the_setting():
    n, share = 2000, 0.25
    changed = sum(repeat_span(window(seed=i), np.array([0]), 257, EOD, share, seed=1)[1] is not None for i in range(n))
    sd = (n * share * (1 - share)) ** 0.5  # binomial
    assert abs(changed - n * share) < 5 * sd, changed
    assert all(repeat_span(window(seed=i), np.array([0]), 257, EOD, 0.0, seed=1)[1] is None for i in range(50))


def test_the_span_stays_inside_the_longest_document_before_its_eod_and_the_padding():
    w = window(seed=5)
    w[40], w[200] = EOD, EOD  # documents [0, 41), [41, 201), [201, 257): the middle one is the longest
    starts = np.array([0, 41, 201])
    assert longest_segment(starts, 257, EOD, w) == (41, 200)  # its EOD is left out
    for seed in range(30):
        out, (source, repeat, span) = repeat_span(w, starts, 257, EOD, 1.0, seed)
        assert 41 <= source and repeat + span <= 200 and out[200] == EOD and out[40] == EOD
    w[230:] = EOD  # padding from num_tokens = 230 on: the last segment is cut there
    out, change = repeat_span(w, np.array([0, 201]), 230, EOD, 1.0, seed=2)
    assert change[1] + change[2] <= 201 and (out[230:] == EOD).all()


def test_a_sample_without_room_for_a_repeat_is_left_alone():
    w = window(n=12)
    w[5] = EOD
    assert repeat_span(w, np.array([0, 6]), 12, EOD, 1.0, seed=1)[1] is None  # segments of 6 tokens


def test_collate_applies_it_to_tokens_and_labels_alike():
    samples = [{"tokens": window(seed=i), "segment_starts": np.array([0]), "num_tokens": 257} for i in range(4)]
    plain = collate_packed_samples(samples, eod_id=EOD, document_masking=True, eod_mask_loss=False)
    mixed = collate_packed_samples(samples, eod_id=EOD, document_masking=True, eod_mask_loss=False,
                                   repeat_span_share=1.0, seed=9)
    assert not (plain["tokens"] == mixed["tokens"]).all()
    assert (mixed["tokens"][:, 1:] == mixed["labels"][:, :-1]).all()
    for key in ("loss_mask", "position_ids", "document_ids"):
        assert (plain[key] == mixed[key]).all()


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_the_share_is_checked(value):
    from cplm_megatron.data.config import DataConfig
    from cplm_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="data.repeat_span_share"):
        DataConfig(repeat_span_share=value).validate()
    with pytest.raises(ConfigError, match="data.synthetic"):
        DataConfig(repeat_span_share=0.5, synthetic="copy").validate()


def test_the_training_loader_repeats_spans_and_validation_is_untouched(tiny_corpus, isolated_streaming):
    from cplm_megatron.data.config import BatchShape, DataConfig
    from cplm_megatron.data.loader import build_train_loader, build_val_loader

    shape = BatchShape(tiny_corpus.seq_len, 4, 4)
    data = str(tiny_corpus.dataset_dir)

    def first(share: float, val: bool = False):
        cfg = DataConfig(streams=[data], val_streams=[data], repeat_span_share=share, seed=5)
        loader = build_val_loader(cfg, shape, 0, 1) if val else build_train_loader(cfg, shape, 0, 1)
        return next(iter(loader))["tokens"]

    plain, repeated = first(0.0), first(1.0)
    assert plain.shape == repeated.shape
    assert all(not (a == b).all() for a, b in zip(plain, repeated))  # every row of a share of 1 changed
    assert (first(0.0, val=True) == first(1.0, val=True)).all()
