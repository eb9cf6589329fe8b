"""Hugging Face side of CPLM: the self-contained model code and checkpoint writing (both conversions: convert.py)."""

from cplm_megatron.hf.configuration_cplm import CPLMConfig
from cplm_megatron.hf.export import write_hf_checkpoint
from cplm_megatron.hf.modeling_cplm import CPLMForCausalLM

__all__ = ["CPLMConfig", "CPLMForCausalLM", "write_hf_checkpoint"]
