"""Document masking's attention backend (cplm_megatron/model/document_mask.py, attention.py): chosen once at model
build from what this torch and device offer (flash varlen where torch has it, nested jagged tensors, one SDPA call
per document on CPU), `varlen_attn` called with either of its signatures (`is_causal` in torch 2.10/2.11,
`window_size` + `enable_gqa` from 2.12), and the varlen path's packing, GQA handling and unpacking equal to the
dense-mask reference. varlen_attn has no CPU kernel, so its numerics are checked through stand-ins with torch's
two signatures that compute each document's causal attention."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from cplm_megatron.model import document_mask as dm

pytestmark = [pytest.mark.mcore, pytest.mark.mcore_latest]


def _attention(q, k, v, cu, scale, gqa):
    """Each document's causal attention over packed [tokens, heads, d] tensors (what varlen_attn computes)."""
    bounds = cu.tolist()
    pieces = [F.scaled_dot_product_attention(*(t[lo:hi].transpose(0, 1) for t in (q, k, v)), is_causal=True,
                                             scale=scale, enable_gqa=gqa).transpose(0, 1)
              for lo, hi in zip(bounds, bounds[1:])]
    return torch.cat(pieces)


def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False, return_aux=None, scale=None):
    """torch 2.10's signature: no GQA (one k/v head per query head), causality by `is_causal`."""
    assert is_causal and key.shape[1] == query.shape[1] and cu_seq_q.dtype == torch.int32
    assert max_q == max_k == int((cu_seq_q[1:] - cu_seq_q[:-1]).max())
    varlen_2_10.calls += 1
    return _attention(query, key, value, cu_seq_q, scale, gqa=False)


def varlen_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1), enable_gqa=False):
    """torch 2.12's signature: causality by `window_size=(-1, 0)`, grouped k/v by `enable_gqa`."""
    assert window_size == (-1, 0) and torch.equal(cu_seq_q, cu_seq_k)
    assert enable_gqa == (key.shape[1] != query.shape[1])
    varlen_2_12.calls += 1
    return _attention(query, key, value, cu_seq_q, scale, gqa=enable_gqa)


def test_call_arguments_follow_the_signature():
    assert dm.varlen_call_kwargs(varlen_2_10, 0.125, gqa=True) == {"is_causal": True, "scale": 0.125}
    assert dm.varlen_call_kwargs(varlen_2_12, 0.125, gqa=True) == {"window_size": (-1, 0), "scale": 0.125,
                                                                   "enable_gqa": True}
    assert dm.varlen_call_kwargs(varlen_2_12, 0.5, gqa=False) == {"window_size": (-1, 0), "scale": 0.5}
    with pytest.raises(TypeError, match="neither window_size nor is_causal"):
        dm.varlen_call_kwargs(lambda q, k, v, cu_q, cu_k, max_q, max_k: q, 1.0, gqa=False)


def test_backend_selection():
    assert dm.available_document_backends(False, varlen_2_12) == ("per_document",)  # CPU: exact, unchanged
    assert dm.available_document_backends(True, varlen_2_12) == ("varlen", "njt", "per_document")
    assert dm.available_document_backends(True, varlen_2_10) == ("varlen", "njt", "per_document")
    assert dm.available_document_backends(True, None) == ("njt", "per_document")  # torch < 2.10
    assert dm.available_document_backends(True, varlen_2_12, dropout=True) == ("njt", "per_document")
    assert dm.available_document_backends(True, lambda q, k, v: q) == ("njt", "per_document")  # no causal argument
    # this torch (2.13) has varlen_attn with the newer signature; this machine has no CUDA
    fn = dm.varlen_attn_function()
    assert fn is not None and "window_size" in dm.varlen_call_kwargs(fn, 1.0, gqa=False)
    assert dm.select_document_backend(torch.cuda.is_available()) == ("varlen" if torch.cuda.is_available()
                                                                     else "per_document")


def _core(heads: int, groups: int, head_dim: int):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from cplm_megatron.model.attention import SDPAttention

    config = TransformerConfig(num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=head_dim, attention_dropout=0.0)
    one_rank = SimpleNamespace(tp=SimpleNamespace(size=lambda: 1))
    return SDPAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self",
                        pg_collection=one_rank)


@pytest.mark.parametrize("fn", [varlen_2_10, varlen_2_12], ids=["is_causal", "window_size"])
@pytest.mark.parametrize("groups", [4, 2], ids=["mha", "gqa"])
def test_varlen_path_equals_the_dense_mask(monkeypatch, fn, groups):
    from cplm_megatron.model import attention

    heads, d, s, b = 4, 8, 24, 3
    core = _core(heads, groups, d)
    assert core.document_backend == "per_document"  # built on CPU
    core.document_backend = "varlen"
    monkeypatch.setattr(attention, "varlen_attn_function", lambda: fn)
    fn.calls = 0
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, b, n, d, generator=g) for n in (heads, groups, groups))
    ids = torch.tensor([[0] * 5 + [1] * 12 + [2] * 7, [3] * 24, [4] * 1 + [5] * 23])  # a 1-token document too
    mask = dm.document_ids_mask(ids)
    packed = core._documents_varlen(q, k, v, dm.document_spans(mask))
    assert fn.calls == 1
    reference = core(q, k, v, dm.dense_document_mask(dm.document_ids_mask(ids)))
    # fp32 both ways: softmax and value sums over <= 24 keys of d=8 products reduced in other orders, a few
    # units of 2^-24 relative each: 1e-6
    torch.testing.assert_close(packed, reference, rtol=1e-6, atol=1e-6)
    # CPU tensors never take the CUDA paths: the per-document path runs whatever the backend attribute says
    fn.calls = 0
    torch.testing.assert_close(core(q, k, v, mask), reference, rtol=1e-6, atol=1e-6)
    assert fn.calls == 0


def test_the_choice_is_logged_once(caplog):
    caplog.set_level("INFO", logger="cplm_megatron.model.document_mask")
    dm._logged.discard("njt")
    dm.log_document_backend("njt")
    dm.log_document_backend("njt")
    lines = [r.getMessage() for r in caplog.records if "document masking attention" in r.getMessage()]
    assert lines == [f"document masking attention: njt (torch {torch.__version__})"]
