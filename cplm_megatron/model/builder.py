"""`build_run`: the one place a run's model is assembled (Megatron-Core `CPLMGPTModel` chunks from the model,
copy-head, parallel, precision and recompute sections; the backbone's own parts come from its spec,
cplm_megatron/model/backbones/). Everything that builds a model (trainer, scorers, HF converter, model_info,
benchmarks, tests) calls it.

The local (pure megatron-core) layer spec is used on CPU; the Transformer Engine spec when TE and
CUDA are present (required for FP8). TE is imported lazily and never on CPU.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, List, Optional, Protocol

import torch
import torch.nn.functional as F

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.backbones import backbone
from cplm_megatron.model.config import (  # noqa: F401 - Precision/RecomputeConfig re-exported
    CopyHeadConfig,
    ModelConfig,
    PrecisionConfig,
    RecomputeConfig,
)
from cplm_megatron.parallel.config import ParallelConfig

if TYPE_CHECKING:
    from cplm_megatron.parallel.distributed import RankLayout


def te_available() -> bool:
    """Transformer Engine importable and a CUDA device present."""
    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


def use_te_spec(model: ModelConfig, precision: Optional[PrecisionConfig] = None) -> bool:
    """Resolve `model.layer_spec` (auto: TE when available) and check FP8 and the attention can run."""
    if model.layer_spec == "te" and not te_available():
        raise ConfigError("model.layer_spec=te needs transformer_engine and a CUDA GPU; use model.layer_spec=local")
    if model.attention_impl == "te" and not te_available():
        raise ConfigError("model.attention_impl=te needs transformer_engine and a CUDA GPU; "
                          "use model.attention_impl=sdpa (flash attention through torch)")
    if model.attention_impl == "te" and model.layer_spec == "local":
        raise ConfigError("model.attention_impl=te needs the Transformer Engine layer spec; "
                          "use model.layer_spec=te (or auto) or model.attention_impl=sdpa")
    use_te = model.layer_spec == "te" or (model.layer_spec == "auto" and te_available())
    if precision is not None and precision.fp8 and not use_te:
        raise ConfigError("precision.fp8 needs the Transformer Engine layer spec (model.layer_spec=te on a GPU)")
    return use_te


def attention_impl(model: ModelConfig, use_te: bool) -> str:
    """Resolve `model.attention_impl`: auto = TE's attention with the TE spec, SDPA otherwise."""
    if model.attention_impl == "auto":
        return "te" if use_te else "sdpa"
    return model.attention_impl


def layer_spec(model: ModelConfig, use_te: bool):
    """Megatron-Core transformer layer spec of the backbone's family, its core attention per `model.attention_impl`."""
    spec = backbone(model.family).layer_spec(model, use_te)
    impl = attention_impl(model, use_te)
    if impl != "te":
        from cplm_megatron.model.attention import core_attention_class

        # ModuleSpec(TransformerLayer).submodules.self_attention = ModuleSpec(SelfAttention, submodules=...)
        spec.submodules.self_attention.submodules.core_attention = core_attention_class(impl)
    return spec


def transformer_config(
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: Optional[PrecisionConfig] = None,
    recompute: Optional[RecomputeConfig] = None,
    use_te: bool = False,
):
    """The Megatron TransformerConfig for this backbone and layout."""
    from megatron.core.transformer import TransformerConfig

    precision = precision or PrecisionConfig()
    recompute = recompute or RecomputeConfig()
    on_cpu = not torch.cuda.is_available()
    dtype = precision.torch_dtype
    kwargs = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.kv_heads,
        ffn_hidden_size=model.ffn_hidden_size,
        kv_channels=model.head_dim,
        normalization=model.normalization,
        layernorm_epsilon=model.norm_eps,
        gated_linear_unit=model.gated,
        activation_func=F.silu if model.gated else F.gelu,
        add_bias_linear=model.add_bias_linear,
        add_qkv_bias=model.add_bias_linear,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=model.init_method_std,
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        virtual_pipeline_model_parallel_size=parallel.vpp,
        sequence_parallel=parallel.sp,
        context_parallel_size=parallel.cp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=precision.dtype == "bf16",
        fp16=precision.dtype == "fp16",
        use_cpu_initialization=on_cpu,
        # fusions that need Apex/TE/CUDA kernels; SwiGLU's is megatron-core's own (torch.compile'd)
        bias_activation_fusion=(use_te and model.add_bias_linear) or (model.fused_swiglu and model.gated),
        masked_softmax_fusion=use_te,
        persist_layer_norm=False,
        bias_dropout_fusion=use_te,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=use_te,
        cross_entropy_loss_fusion=False,
        deallocate_pipeline_outputs=True,
        calculate_per_token_loss=True,  # losses are token sums; grads normalized by global token count
        **backbone(model.family).transformer_config_kwargs(model),
    )
    if parallel.vpp:
        # Interleaving with pp=2 sends activations and gradients to the same peer in one step; batched
        # isend/irecv can then pair them up swapped (seen with gloo). Megatron-LM's default for
        # interleaving: per-direction p2p ops (overlapped with compute on GPU).
        kwargs.update(batch_p2p_comm=False, overlap_p2p_comm=not on_cpu)
    if recompute.granularity != "none":
        kwargs["recompute_granularity"] = recompute.granularity
        if recompute.granularity == "full":
            kwargs["recompute_method"] = recompute.method
            kwargs["recompute_num_layers"] = recompute.num_layers
    if precision.fp8:
        kwargs.update(
            fp8=precision.fp8,
            fp8_recipe=precision.fp8_recipe,
            fp8_amax_history_len=precision.fp8_amax_history_len,
            fp8_amax_compute_algo=precision.fp8_amax_compute_algo,
        )
    return TransformerConfig(**kwargs)


@dataclass(frozen=True)
class SequenceShape:
    """The `train.*` field build_run reads: the sequence length (rows of a learned position table)."""

    seq_len: int


class RunSpec(Protocol):
    """What build_run reads of a run: a `RunConfig` (run_config.py), or `model_run` of a model alone."""

    model: ModelConfig
    copy_head: CopyHeadConfig
    parallel: ParallelConfig
    precision: PrecisionConfig
    recompute: RecomputeConfig
    train: Any  # .seq_len


@dataclass
class ModelRun:
    """A run of a model alone (no data, no optimizer): converters, model_info, benchmarks, tests."""

    model: ModelConfig
    copy_head: CopyHeadConfig
    parallel: ParallelConfig
    precision: PrecisionConfig
    recompute: RecomputeConfig
    train: SequenceShape


def model_run(
    model: ModelConfig,
    copy_head: Optional[CopyHeadConfig] = None,
    parallel: Optional[ParallelConfig] = None,
    precision: Optional[PrecisionConfig] = None,
    recompute: Optional[RecomputeConfig] = None,
    seq_len: Optional[int] = None,
) -> ModelRun:
    """`model` (+ the copy head; None: the baseline) as build_run takes it: TP = PP = 1, fp32 and no
    recomputation unless given; `seq_len` defaults to model.max_position_embeddings."""
    return ModelRun(model, copy_head or CopyHeadConfig(enabled=False), parallel or ParallelConfig(),
                    precision or PrecisionConfig(), recompute or RecomputeConfig(),
                    SequenceShape(seq_len or model.max_position_embeddings))


def single_process_run(cfg: RunSpec) -> ModelRun:
    """The run `cfg` as one process loads it to score or convert it: TP = PP = CP = 1, its dtype without FP8, no
    recomputation, eager layers (no compile time), and a GPU-only LM-head loss as its CPU twin where Triton cannot
    run (same values)."""
    from cplm_megatron.model.lm_head_loss import runnable_here

    model = replace(cfg.model, lm_head_loss=runnable_here(cfg.model.lm_head_loss), compile=False)
    return model_run(model, cfg.copy_head, precision=PrecisionConfig(dtype=cfg.precision.dtype),
                     seq_len=cfg.train.seq_len)


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer facts a model is built for: token ids are < `size` (the tokenizer's vocabulary); the
    embedding and output layer have `padded` rows (layout-independent, so checkpoints reshard)."""

    size: int
    padded: int


@dataclass(frozen=True)
class BuiltRun:
    """What build_run assembled for this process."""

    chunks: List["torch.nn.Module"]  # CPLMGPTModel per virtual pipeline stage (Float16Module-wrapped in bf16/fp16)
    layout: RankLayout  # this rank's place in the layout they were built for
    vocab: Vocabulary
    copy_head: Optional[CopyHeadConfig]  # None: the baseline (exactly the plain backbone)
    use_te: bool  # Transformer Engine layer spec (else megatron-core's local one)
    attention: str  # the core attention: te | sdpa | megatron

    @property
    def model(self) -> "torch.nn.Module":
        """The one model chunk (no virtual pipeline stages)."""
        if len(self.chunks) != 1:
            raise ValueError(f"the run has {len(self.chunks)} model chunks (virtual pipeline stages); use .chunks")
        return self.chunks[0]


def build_run(cfg: RunSpec, layout: Optional[RankLayout] = None) -> BuiltRun:
    """The one place a run's model is assembled (trainer, scorers, converters, model_info, benchmarks).

    `cfg`: a RunConfig, `model_run(...)` or `single_process_run(run_config)`. The Megatron parallel state must
    exist and have cfg.parallel's sizes (`init_distributed`, or `single_process_megatron` in one process);
    `layout` is the one init_distributed returned (read from the parallel state when not given). Builds under
    the caller's RNG state and device context (e.g. `torch.device("meta")`)."""
    from megatron.core import parallel_state as ps

    from cplm_megatron.model.cplm_gpt import CPLMGPTModel
    from cplm_megatron.parallel.distributed import rank_layout

    model, parallel = cfg.model, cfg.parallel
    layout = layout or rank_layout(parallel)
    te = use_te_spec(model, cfg.precision)
    config = transformer_config(model, parallel, cfg.precision, cfg.recompute, te)
    spec = layer_spec(model, te)
    vpp = parallel.vpp
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        chunk = CPLMGPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=model.padded_vocab_size,
            max_sequence_length=cfg.train.seq_len,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            parallel_output=True,
            share_embeddings_and_output_weights=model.tie_embeddings,
            position_embedding_type=model.position_embedding,
            rotary_base=int(model.rope_theta),
            copy_head=cfg.copy_head,
            lm_head_loss=model.lm_head_loss,
            vp_stage=stage,
        )
        if torch.cuda.is_available() and not any(p.is_meta for p in chunk.parameters()):
            chunk.cuda(torch.cuda.current_device())
        if config.bf16 or config.fp16:
            # As Megatron-LM does: every parameter in 16 bit (torch norms are built in fp32, which the
            # mixed-precision optimizer's checkpoint mapping cannot handle), fp32 outputs on the last stage.
            from megatron.core.transformer.module import Float16Module

            chunk = Float16Module(config, chunk)
        chunks.append(chunk)
    if model.compile:
        from cplm_megatron.model.compile import compile_chunks

        compile_chunks(chunks)
    head = cfg.copy_head if cfg.copy_head is not None and cfg.copy_head.enabled else None
    return BuiltRun(chunks, layout, Vocabulary(model.vocab_size, model.padded_vocab_size), head, te,
                    attention_impl(model, te))
