"""cplm_megatron.parallel"""
