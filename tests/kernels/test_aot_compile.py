"""The fused kernels compile for sm_90 (H100/H200) on this CPU machine (Triton AOT + bundled ptxas)."""
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # real GPU kernels, not interpreted
    result = subprocess.run([sys.executable, "-m", "cplm_kernels.aot_check", "--quick", "--arch", "90"], env=env,
                            capture_output=True, text=True, check=False, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("PASS"), result.stdout + result.stderr
    assert result.stdout.count("\nok ") + result.stdout.startswith("ok ") == 9  # 3 variants x 3 kernels
