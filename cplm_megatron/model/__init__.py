"""cplm_megatron.model"""
