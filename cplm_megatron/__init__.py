"""cplm-megatron: Megatron-Core GPT backbones with a vocab-parallel Copy-Paste head."""
__version__ = "0.1.0"
