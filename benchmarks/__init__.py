"""The benchmarks and the GPU check (`gpu/`): scripts run from the checkout's root as modules
(`python -m benchmarks.copy_kernel ...`), importing the project as users do and their shared helpers from here
(`common`: what every benchmark measures alike; `ratios`: a variant's figures over a reference's; `partial_results`:
the JSON written after every variant). Nothing in the project imports this package."""
