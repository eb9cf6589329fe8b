"""The GPU check: its training runs by group (`runs`), the steps of `run_gpu_checks.sh` (`gpu_steps`: install
check, compat, the torch-free summary), the trainer and the transformers peer it times (`train_runs`, `hf_peer`),
the study step and the tables quoted from its records (`results_table`)."""
