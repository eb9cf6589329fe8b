"""Kernel tests run the Triton kernels in the CPU interpreter.

Triton decides interpreter vs GPU when a kernel is decorated, so the variable is set here, before
any test module imports triton (TRITON_INTERPRET=1; the interpreter takes ~2 ms per program instance, so T <= 256).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"
