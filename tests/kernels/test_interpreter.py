"""Runtime-mode handling: the tl.dot plan per dtype, lazy triton import, interpreter/GPU mismatch."""
import os
import subprocess
import sys

import pytest
import torch

from cplm_kernels.interpreter import (
    DOT_BF16,
    DOT_FP32,
    DOT_NATIVE,
    DotPlan,
    dot_plan,
    fused_available,
    interpreting,
)


def test_interpreter_upcasts_every_dot_to_fp32():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        plan = dot_plan(dtype, None)
        assert (plan.score_mode, plan.grad_mode, plan.input_precision) == (DOT_FP32, DOT_FP32, "ieee")


def test_gpu_plan_keeps_fp32_exact_and_uses_fp8_tensor_cores_from_sm89():
    assert dot_plan(torch.float32, (9, 0)).input_precision == "ieee"
    assert dot_plan(torch.bfloat16, (9, 0)).score_mode == DOT_NATIVE
    assert dot_plan(torch.float8_e4m3fn, (9, 0)) == DotPlan(DOT_NATIVE, DOT_BF16, "tf32")
    with pytest.raises(ValueError, match="compute capability"):
        dot_plan(torch.float8_e4m3fn, (8, 0))  # Triton has no e4m3 before sm_89


def test_fused_available_under_the_interpreter():
    assert interpreting() and fused_available()


def _run_python(code: str, env_update: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, timeout=120)


def test_package_imports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import cplm_kernels as ck\n"
        "assert not ck.fused_available()\n"
        "try:\n    ck.copy_lse_fused\nexcept ImportError as e:\n    assert 'copy_lse_chunked' in str(e)\n"
        "else:\n    raise SystemExit('expected ImportError')\n"
        "print('ok')\n"
    )
    result = _run_python(code, {})
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_cpu_tensors_with_gpu_kernels_fail_clearly():
    code = (
        "import torch, cplm_kernels as ck\n"
        "q = torch.randn(1, 1, 8, 32)\n"
        "try:\n    ck.copy_lse_fused(q, q, torch.zeros(1, 8, dtype=torch.long))\n"
        "except RuntimeError as e:\n    print(e)\n"
    )
    result = _run_python(code, {"CUDA_VISIBLE_DEVICES": ""})
    assert "TRITON_INTERPRET=1" in result.stdout, result.stdout + result.stderr
