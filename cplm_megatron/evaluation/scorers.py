"""One scoring interface over Megatron checkpoints and Hugging Face exports.

A scorer turns a batch in the loader contract (cplm_megatron.data.batch: tokens, labels, loss_mask,
position_ids, document_ids; all [b, s]) into the model's full next-token distribution,
``log p(v | x_<=t)`` as fp32 ``[b, s, V]`` (the Copy-Paste mixture for CPLM models, the LM softmax for
baselines). Every task computes its numbers from these log-probs, so both backends give the same
numbers for the same weights.

Documents: Megatron evaluates a packed row as the run trained: copy candidates always restart at each
document, attention and positions too when the run used document masking. The HF model resets copy
candidates at EOD but attends over its whole input, so `HFScorer` (whose batches carry document ids)
runs each document segment of a row as its own sequence: the computation of a document-masked run.

Context parallelism: a Megatron checkpoint is scored at CP=1, whatever `parallel.cp` trained it. CP splits
the sequence, not the weights, so the checkpoint loads whole into this one process; the tasks need the
mixture's full distribution, which the model computes at CP=1 only. `cp_note` is the line saying so, and
tests/parallel/test_context_parallel.py checks that a CP=2 checkpoint scores (and exports) to the numbers
its own CP=2 forward gives.

Vocabulary: Megatron's output layer has `model.padded_vocab_size` rows and its softmax includes the
padding rows; HF exports drop them. The backends agree exactly when model.vocab_size is a multiple
of model.vocab_pad_multiple (128), as for the project's tokenizers; otherwise the Megatron numbers
include the (small, untrained-towards) probability of the padding ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from cplm_megatron.checkpoint.lookup import CheckpointRef, read_saved_config, resolve_verified
from cplm_megatron.model.layout import single_process_megatron  # noqa: F401 - scorers load inside it

Batch = dict[str, torch.Tensor]


class Scorer(Protocol):
    """What every task needs from a model."""

    backend: str  # "megatron" | "hf"
    description: str  # what was loaded (for reports)
    vocab_size: int  # token ids the model was trained on: [0, vocab_size)
    max_length: int  # longest position the model supports
    has_copy_head: bool
    document_masking: bool  # whether packed rows are scored per document

    def log_probs(self, batch: Batch) -> torch.Tensor:
        """fp32 [b, s, V'] log-probabilities of the next token (V' >= vocab_size: padded vocabularies)."""
        ...


def document_segments(batch: Batch) -> list[tuple[int, int, int]]:
    """(row, start, end) of every contiguous document segment of every row (the whole row without document_ids)."""
    tokens = batch["tokens"]
    b, s = tokens.shape
    doc_ids = batch.get("document_ids")
    if doc_ids is None:
        return [(row, 0, s) for row in range(b)]
    segments = []
    for row in range(b):
        ids = doc_ids[row]
        starts = [0] + (torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1).tolist()
        ends = starts[1:] + [s]
        segments.extend((row, start, end) for start, end in zip(starts, ends))
    return segments


# ---------------------------------------------------------------------------------------------- Megatron


def _require_single_process_state() -> None:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        raise RuntimeError("MegatronScorer.load needs Megatron parallel state: wrap the call in "
                           "`with single_process_megatron():` (cplm_megatron.evaluation.scorers)")
    if ps.get_tensor_model_parallel_world_size() != 1 or ps.get_pipeline_model_parallel_world_size() != 1:
        raise RuntimeError("MegatronScorer evaluates in one process: the existing parallel state has tp/pp > 1")


def saved_run_config(checkpoint: Path):
    """The resolved RunConfig stored in a checkpoint's common state."""
    from cplm_megatron.run_config import run_config_from_saved

    return run_config_from_saved(read_saved_config(checkpoint))


def _build(cfg):
    """A tp = pp = 1 CPLMGPTModel for a run config (builder.single_process_run: no FP8 at evaluation; a GPU-only
    LM-head loss becomes its CPU twin, same values), in the run's dtype; outside the Float16Module of a bf16/fp16 run
    (which only casts float inputs and outputs), so the tasks reach its decoder and copy head."""
    from cplm_megatron.checkpoint.weights import unwrap
    from cplm_megatron.model.builder import build_run, single_process_run

    return unwrap(build_run(single_process_run(cfg)).model)


@dataclass
class MegatronScorer:
    """A CPLMGPTModel (tp = pp = 1) loaded from a training checkpoint."""

    model: Any  # CPLMGPTModel
    config: Any  # RunConfig the checkpoint was trained with
    checkpoint: CheckpointRef
    backend: str = "megatron"

    @classmethod
    def load(cls, path: str | Path) -> MegatronScorer:
        """Load weights from a run dir, checkpoint root or iter_* dir (needs `single_process_megatron()`)."""
        from cplm_megatron.checkpoint.weights import load_weights

        _require_single_process_state()
        ref = resolve_verified(path)  # its checksums, before anything of it is read
        cfg = saved_run_config(ref.path)
        model = _build(cfg)
        load_weights([model], ref.path, verified=True)
        return cls(model.eval(), cfg, ref)

    @classmethod
    def initial(cls, path: str | Path) -> MegatronScorer:
        """The untrained model of a run (iteration 0): its config, its seed, no weights loaded.

        The trainer builds its model right after seeding with run.seed, as here, so this is the
        model training started from (needs `single_process_megatron()`).
        """
        from cplm_megatron.parallel.distributed import set_seed

        _require_single_process_state()
        ref = resolve_verified(path)
        cfg = saved_run_config(ref.path)
        set_seed(cfg.run.seed)
        return cls(_build(cfg).eval(), cfg, CheckpointRef(ref.path.parent, 0))

    @property
    def description(self) -> str:
        if self.checkpoint.iteration == 0:
            return f"megatron:{self.checkpoint.path} (untrained, iteration 0)"
        return f"megatron:{self.checkpoint.path} (iteration {self.checkpoint.iteration})"

    @property
    def iteration(self) -> int:
        return self.checkpoint.iteration

    @property
    def vocab_size(self) -> int:
        return self.config.model.vocab_size

    @property
    def max_length(self) -> int:
        return self.config.model.max_position_embeddings

    @property
    def has_copy_head(self) -> bool:
        return self.model.copy_head is not None

    @property
    def document_masking(self) -> bool:
        return bool(self.config.data.document_masking)

    @property
    def trained_cp(self) -> int:
        """The context-parallel size the checkpoint was trained with (it is scored at CP=1)."""
        return int(self.config.parallel.cp)

    def model_inputs(self, batch: Batch) -> dict[str, Any]:
        """The model call arguments the trainer would build for this batch."""
        from cplm_megatron.model.inputs import model_inputs

        return model_inputs(batch, next(self.model.parameters()).device, self.document_masking)

    @torch.no_grad()
    def log_probs(self, batch: Batch) -> torch.Tensor:
        return self.model(**self.model_inputs(batch), output="log_probs_gathered").float()


def cp_note(scorer: Scorer) -> str | None:
    """The log line for a checkpoint trained under context parallelism (scored at CP=1); None otherwise."""
    cp = getattr(scorer, "trained_cp", 1)
    if cp == 1:
        return None
    return (f"[evaluate] {scorer.description}: trained at parallel.cp={cp}, scored at cp=1 in this one process "
            f"(context parallelism splits the sequence, not the weights; the tasks' full distribution is computed "
            f"at cp=1 only)")


# ---------------------------------------------------------------------------------------------- HF


@dataclass
class HFScorer:
    """A Hugging Face causal LM directory: a CPLM export (trust_remote_code) or a plain baseline export."""

    model: Any  # transformers PreTrainedModel
    directory: Path
    backend: str = "hf"
    document_masking: bool = True

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> HFScorer:
        """Load an exported model directory offline."""
        from transformers import AutoModelForCausalLM

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"--hf {path}: no config.json; pass a directory written by tools/convert_to_hf.py")
        model = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=True, local_files_only=True,
                                                     dtype=dtype)
        return cls(model.eval(), path)

    @property
    def description(self) -> str:
        return f"hf:{self.directory}"

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def max_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    @property
    def has_copy_head(self) -> bool:
        return getattr(self.model, "copy_head", None) is not None

    @property
    def outputs_log_probs(self) -> bool:
        """CPLM exports return mixture log-probs as `logits`; plain exports return raw logits."""
        return self.model.config.model_type == "cplm"

    @torch.no_grad()
    def log_probs(self, batch: Batch) -> torch.Tensor:
        tokens = batch["tokens"]
        segments = document_segments(batch)
        if all(start == 0 and end == tokens.shape[1] for _, start, end in segments):
            return self._segment_log_probs(tokens)
        out: torch.Tensor | None = None
        for row, start, end in segments:
            lp = self._segment_log_probs(tokens[row:row + 1, start:end])[0]
            if out is None:
                out = torch.empty(*tokens.shape, lp.shape[-1], dtype=torch.float32)
            out[row, start:end] = lp
        return out

    def _segment_log_probs(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=input_ids.to(self.model.device)).logits.float().cpu()
        return logits if self.outputs_log_probs else torch.log_softmax(logits, dim=-1)


# ---------------------------------------------------------------------------------------------- hidden states


@torch.no_grad()
def hidden_and_log_probs(scorer: Scorer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Final (normed) hidden states [b, s, d] and the model's log-probs [b, s, V'] of one batch.

    Megatron: one forward (the decoder's output, after its final norm, captured by a hook); HF: the
    base model and the full model per document segment, as `HFScorer.log_probs` scores them."""
    if isinstance(scorer, MegatronScorer):
        captured: list[torch.Tensor] = []
        handle = scorer.model.decoder.register_forward_hook(lambda _m, _a, out: captured.append(out))
        try:
            log_probs = scorer.log_probs(batch)
        finally:
            handle.remove()
        return captured[0].detach().transpose(0, 1).float(), log_probs
    if isinstance(scorer, HFScorer):
        tokens = batch["tokens"]
        hidden = log_probs = None
        for row, start, end in document_segments(batch):
            ids = tokens[row:row + 1, start:end].to(scorer.model.device)
            h = scorer.model.model(input_ids=ids).last_hidden_state[0].float().cpu()
            lp = scorer._segment_log_probs(ids)[0]
            if hidden is None:
                hidden = torch.zeros(*tokens.shape, h.shape[-1])
                log_probs = torch.zeros(*tokens.shape, lp.shape[-1])
            hidden[row, start:end] = h
            log_probs[row, start:end] = lp
        return hidden, log_probs
    raise TypeError(f"unsupported scorer {type(scorer).__name__}: hidden states need a Megatron or HF model")


@torch.no_grad()
def lm_head_log_probs(scorer: Scorer, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head's own log-softmax [b, s, V'] of final hidden states [b, s, d] (no copy mixture; a Megatron
    model's on its device, as its `log_probs`)."""
    if isinstance(scorer, MegatronScorer):
        model = scorer.model
        weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
        param = next(model.parameters())
        logits, _ = model.output_layer(hidden.transpose(0, 1).to(param.device, param.dtype).contiguous(), weight=weight)
        return torch.log_softmax(logits.float(), dim=-1).transpose(0, 1)
    if isinstance(scorer, HFScorer):
        param = next(scorer.model.parameters())
        logits = scorer.model.lm_head(hidden.to(param.device, param.dtype))
        return torch.log_softmax(logits.float(), dim=-1).cpu()
    raise TypeError(f"unsupported scorer {type(scorer).__name__}")
