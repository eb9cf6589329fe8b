"""Synthetic training tasks (cplm_megatron/data/synthetic.py): mixtures by sample index, passkey training samples,
and one clear error for an unknown task."""
import pytest
import torch

from cplm_megatron.data.synthetic import SyntheticLoader, copy_sample, passkey_sample, task_sample


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


def test_unknown_tasks_name_the_choices():
    from cplm_megatron.data.config import DataConfig
    from cplm_megatron.errors import ConfigError

    for bad in ("copy+copy", "copy+repeat", ""):
        with pytest.raises(ValueError, match=r"choose one of \('spamlang', 'copy', 'passkey'\) or several joined"):
            SyntheticLoader(bad, 16, 10, 1, 0, 1)
    with pytest.raises(ConfigError, match=r"data\.synthetic: unknown synthetic training task 'copy\+repeat'"):
        DataConfig(synthetic="copy+repeat").validate()
    DataConfig(synthetic="spamlang+copy+passkey").validate()
