"""FP8 current-scaling quantization: scale layout and round-trip error within e4m3 precision."""
import pytest
import torch

from cplm_kernels.fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8

# e4m3: 3 mantissa bits -> round-to-nearest relative error <= 2^-4 for normal values; below the
# smallest normal (2^-6 * scale) the absolute spacing is 2^-9 * scale -> error <= 2^-10 * scale.
REL = 2.0**-4
SUBNORMAL_ABS = 2.0**-10


def assert_roundtrip(x, x8, row_scale):
    back = x8.float() * row_scale
    err = (back - x.float()).abs()
    bound = REL * x.float().abs() + SUBNORMAL_ABS * row_scale
    assert (err <= bound * (1 + 1e-6)).all(), f"max excess {(err - bound).max().item():.3e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_tensor_roundtrip(dtype):
    x = (torch.randn(2, 3, 50, 32) * torch.logspace(-4, 2, 32)).to(dtype)
    x8, scale = quantize_fp8(x)
    assert x8.dtype == FP8_DTYPE and scale.dim() == 0 and scale.dtype == torch.float32
    assert x8.float().abs().max().item() == FP8_MAX  # amax maps onto the largest e4m3 value
    assert_roundtrip(x, x8, scale)
    # bitwise: dequantize_fp8 is this one fp32 product
    assert torch.equal(dequantize_fp8(x8, scale), x8.float() * scale)


def test_per_block_roundtrip_and_layout():
    x = torch.randn(2, 3, 70, 32)
    x[:, :, 32:64] *= 1e6  # per tensor, this block would flush the other rows to zero
    x8, scale = quantize_fp8(x, block_rows=32)
    assert scale.shape == (2, 3, 3)
    row_scale = scale.repeat_interleave(32, dim=-1)[..., :70, None]
    assert_roundtrip(x, x8, row_scale)
    per_tensor_err = (dequantize_fp8(*quantize_fp8(x))[..., :32, :] - x[..., :32, :]).abs().max()
    per_block_err = (dequantize_fp8(x8, scale, 32)[..., :32, :] - x[..., :32, :]).abs().max()
    assert per_block_err < per_tensor_err / 10
    for blk in range(3):  # every block's own amax maps onto FP8_MAX
        assert torch.all(x8[..., blk * 32:(blk + 1) * 32, :].float().abs().amax(dim=(-2, -1)) == FP8_MAX)


def test_zero_tensor_and_bad_inputs():
    x8, scale = quantize_fp8(torch.zeros(1, 1, 5, 32), block_rows=4)
    # an all-zero block gets scale 1 by definition (no arithmetic)
    assert torch.equal(scale, torch.ones(1, 1, 2)) and not x8.float().any()
    with pytest.raises(ValueError, match="bf16/fp16/fp32"):
        quantize_fp8(x8)
    with pytest.raises(ValueError, match=r"\[b, H, T, d\]"):
        quantize_fp8(torch.randn(5, 32), block_rows=4)
    with pytest.raises(ValueError, match="pass block_rows"):
        dequantize_fp8(x8, scale)
