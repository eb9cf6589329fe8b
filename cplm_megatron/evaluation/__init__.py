"""cplm_megatron.evaluation"""
