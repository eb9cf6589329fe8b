"""cplm_megatron.training"""
