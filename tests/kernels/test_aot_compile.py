"""The fused kernels (copy scores, cross-entropy tiles) compile for sm_90 (H100/H200) on this CPU machine
(Triton AOT + bundled ptxas)."""
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
    # 3 copy variants x 4 kernels (forward, statistics, dQ, dK) + the small-grid forward of the two tensor-core
    # variants (fp32 has one forward) + 2 dtypes x 2 cross-entropy tile kernels
    assert result.stdout.count("\nok ") + result.stdout.startswith("ok ") == 18
    assert result.stdout.count("fwd_small") == 2 and result.stdout.count(" stats ") == 3
    assert result.stdout.count("ce_stats") == 2 and result.stdout.count("ce_grad") == 2
