"""Synthetic training tasks (cplm_megatron/data/synthetic.py): mixtures by sample index, passkey training samples,
and one clear error for an unknown task."""
import pytest
import torch

from cplm_megatron.data.synthetic import (
    SyntheticLoader,
    copy_random_sample,
    copy_sample,
    copy_task_sample,
    passkey_sample,
    task_sample,
)


def test_a_mixture_alternates_its_parts_by_sample_index():
    seq, vocab = 64, 50
    for index in range(6):
        got = task_sample("copy+passkey", index, seq, vocab, seed=3)
        assert got.shape == (seq + 1,)
        if index % 2 == 0:  # the copy part: the very sample of the plain task
            assert torch.equal(got, copy_sample(index, seq, vocab, 3)[0])
        else:  # passkey: marker 1 + key inside, marker 2 + the same key at the end
            key = got[-4:]
            assert got[-5] == 2 and int((got == 1).sum()) == 1
            at = int((got == 1).nonzero())
            assert torch.equal(got[at + 1:at + 5], key) and bool((key >= 3).all())


def test_passkey_training_needles_spread_over_the_depths():
    """Depth frac(i x golden ratio): 20 samples put their needles in every fifth of the context."""
    seq = 200
    starts = []
    for index in range(20):
        tokens = task_sample("passkey", index, seq, 100, seed=0)
        starts.append(int((tokens == 1).nonzero()) / (seq + 1 - 10))
        depth = (index * 0.6180339887498949) % 1.0
        assert torch.equal(tokens, passkey_sample(index, seq + 1, depth, 100, 0).tokens)
    assert {min(int(5 * s), 4) for s in starts} == {0, 1, 2, 3, 4}


def test_copy_random_repeats_a_span_of_varying_length_at_varying_offsets():
    """Each sample: one span of 1/8..1/2 of its tokens recurs later, not overlapping; starts and lengths vary
    (the `copy` task's repeat is always at seq_len/2), and the sample is the training task's."""
    seq = 255
    layouts = set()
    for index in range(40):
        s = copy_random_sample(index, seq, 1000, seed=2)
        n, m, r = len(s.tokens), s.repeat_len, s.repeat_start
        assert n == seq + 1 and 256 // 8 <= m <= 256 // 2 and r + m <= n
        origins = [a for a in range(0, r - m + 1) if torch.equal(s.tokens[a:a + m], s.tokens[r:r + m])]
        assert origins, index  # the repeat copies an earlier span that ends before it starts
        assert torch.equal(task_sample("copy_random", index, seq, 1000, seed=2), s.tokens)
        layouts.add((r, m))
    assert len(layouts) > 30
    assert len({r for r, _ in layouts}) > 20
    half = copy_task_sample("half", 3, 64, 50, seed=1)
    assert torch.equal(half.tokens, copy_sample(3, 64, 50, 1)[0]) and (half.repeat_start, half.repeat_len) == (32, 33)
    with pytest.raises(ValueError, match="copy_random needs seq_len >= 7"):
        copy_random_sample(0, 6, 50)
    with pytest.raises(ValueError, match=r"unknown copy layout 'middle'; choose one of \('half', 'random'\)"):
        copy_task_sample("middle", 0, 64, 50)


def test_unknown_tasks_name_the_choices():
    from cplm_megatron.data.config import DataConfig
    from cplm_megatron.errors import ConfigError

    for bad in ("copy+copy", "copy+repeat", ""):
        with pytest.raises(ValueError, match=r"choose one of \('spamlang', 'copy', 'copy_random', 'passkey'\) or several joined"):
            SyntheticLoader(bad, 16, 10, 1, 0, 1)
    with pytest.raises(ConfigError, match=r"data\.synthetic: unknown synthetic training task 'copy\+repeat'"):
        DataConfig(synthetic="copy+repeat").validate()
    DataConfig(synthetic="spamlang+copy+passkey").validate()
    DataConfig(synthetic="copy_random+passkey").validate()
