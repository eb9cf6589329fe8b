"""Imported first by the warm forkserver (warm.py PRELOAD): hides megatron-core's expected "Apex/TE not
installed" warnings, which the server would otherwise print once for every module it preloads."""
from cplm_megatron.entry_points import quiet_known_warnings

quiet_known_warnings()
