"""Recipes (`*.yaml`) and model presets (`models/*.yaml`), installed as the package data of
`cplm_megatron.recipes`: `--config tiny` and `model.preset=tiny` find them outside a checkout too."""
