"""One launcher (launcher: `python -m cplm_megatron.pretrain` / `.evaluate` in warm processes, a fresh interpreter
or torchrun, SLURM), the warm processes it forks from (warm) and what their forkserver imports (forkserver_init)."""
