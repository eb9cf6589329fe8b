"""The Copy-Paste mixing rule as ``modeling_cplm.py`` imports it (``from .mixing import ...``).

Inside the package this is `cplm_megatron.model.mixing` itself; an exported directory ships that
module's file under this name (``export.py``), so an export mixes exactly as training does.
"""
from cplm_megatron.model.mixing import (  # noqa: F401
    MIXING_RULES,
    CopyStats,
    MixingRule,
    MixtureWeights,
    mix_log_probs,
    mixing_rule,
    mixture_weights,
)
