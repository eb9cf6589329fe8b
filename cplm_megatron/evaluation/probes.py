"""`train.probe_interval`: in-context copying measured while a model trains, so the step where it emerges is seen.

`ProbeCallback` is a trainer callback (training/callbacks.py), added by `cplm_megatron.pretrain`. Every
`probe_interval` iterations (and before the first step of a fresh run) it logs one metrics.jsonl record with
- `probe_copy_accuracy`: next-token accuracy of the model's full distribution (the mixture for CPLM) on the copy
  task's repeats (evaluation/tasks/copy.py: a random span and its repeat, `probe_copy_length` tokens; the same
  `probe_sequences` samples every time, drawn with the evaluator's seed), beside `probe_copy_chance` = 1/(V-1);
- `probe_in_context_score`: mean NLL at late minus early context positions on the run's validation batches
  (evaluation/metrics.py ContextTally; negative: the model uses its context);
- `probe_text_copy_accuracy`, `probe_text_copy_first_accuracy`, `probe_text_copy_gain`: held-out text repeated once
  (evaluation/text_copy.py; a span of each validation batch row's longest document, `probe_copy_length` / 2 tokens).
Copy samples are shared out over the data-parallel ranks and the sums reduced over them; tensor-parallel ranks
compute the same gathered distribution. Needs pipeline and context parallel size 1 (run_config checks it).
"""
from __future__ import annotations

from typing import Dict, List

import torch

from cplm_megatron.data.synthetic import copy_task_sample, make_batch
from cplm_megatron.evaluation.metrics import ContextTally, target_log_probs
from cplm_megatron.evaluation.options import EVAL_SEED
from cplm_megatron.evaluation.tasks.copy import repeat_mask
from cplm_megatron.evaluation.text_copy import TextCopyTally, text_copy_batch, text_spans
from cplm_megatron.model.inputs import model_inputs

Batch = Dict[str, torch.Tensor]


class CopyProbe:
    """The copy-task samples of one data-parallel rank and the validation batches it scores."""

    def __init__(self, sequences: int, length: int, vocab_size: int, dp_rank: int, dp_size: int,
                 val_batches: List[Batch], document_masking: bool, micro_batch: int):
        samples = [copy_task_sample("half", i, length, vocab_size, EVAL_SEED) for i in range(dp_rank, sequences,
                                                                                          dp_size)]
        self.copy_batches = [(make_batch([s.tokens for s in chunk]), repeat_mask(chunk, length))
                             for chunk in (samples[i:i + micro_batch] for i in range(0, len(samples), micro_batch))]
        self.val_batches = val_batches
        self.half = length // 2
        spans = text_spans(val_batches, self.half)
        self.text_batches = [text_copy_batch(spans[i:i + micro_batch]) for i in range(0, len(spans), micro_batch)]
        self.document_masking = document_masking
        self.vocab_size = vocab_size

    @torch.no_grad()
    def measure(self, model: torch.nn.Module) -> Dict[str, float]:
        """The probe record's figures for `model` (the first model chunk; every rank calls)."""
        device = next(model.parameters()).device
        model.eval()
        try:
            correct = count = 0
            for batch, select in self.copy_batches:
                right = self._log_probs(model, batch, device).argmax(-1).cpu() == batch["labels"]
                correct += int(right[select].sum())
                count += int(select.sum())
            context = ContextTally(self.val_batches[0]["tokens"].shape[1] if self.val_batches else 1)
            for batch in self.val_batches:
                nll = -target_log_probs(self._log_probs(model, batch, device), batch["labels"])
                context.add_nll(nll, batch["loss_mask"], batch["position_ids"])
            text = TextCopyTally()
            for batch in self.text_batches:
                text.add(self._log_probs(model, batch, device), batch, self.half)
        finally:
            model.train()
        totals = _dp_sum([correct, count, *context.sums, *context.counts, text.first, text.repeat, text.tokens],
                         device)
        context.sums, context.counts = (totals[2], totals[3]), (int(totals[4]), int(totals[5]))
        out = {"probe_copy_accuracy": totals[0] / max(totals[1], 1.0), "probe_copy_tokens": int(totals[1]),
               "probe_copy_chance": 1.0 / (self.vocab_size - 1)}
        if self.val_batches:
            out["probe_in_context_score"] = context.score
        if totals[8]:
            out.update(TextCopyTally(int(totals[6]), int(totals[7]), int(totals[8])).metrics("probe_text_copy_"))
        return out

    def _log_probs(self, model: torch.nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
        inputs = model_inputs(batch, device, self.document_masking)
        return model(**inputs, output="log_probs_gathered").float()


def _dp_sum(values: list, device: torch.device) -> list:
    """Sums of `values` over the data-parallel group (as floats)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    total = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    if dist.is_initialized() and ps.get_data_parallel_world_size() > 1:
        dist.all_reduce(total, group=ps.get_data_parallel_group())
    return total.tolist()


class ProbeCallback:
    """Logs the probe record before a fresh run's first step and every `train.probe_interval` iterations."""

    def __init__(self, interval: int, sequences: int, length: int):
        self.interval, self.sequences, self.length = interval, sequences, length
        self.probe: CopyProbe | None = None

    def on_start(self, trainer) -> None:
        """Build the probe's batches; measure the untrained model of a fresh run (iteration 0)."""
        cfg = trainer.cfg
        val = list(trainer.validation_batches()) if trainer.val_data is not None else []
        self.probe = CopyProbe(self.sequences, self.length, trainer.built.vocab.size, trainer.layout.dp_rank,
                               trainer.layout.dp, val, cfg.data.document_masking, cfg.train.micro_batch)
        if trainer.state.iteration == 0:
            self._log(trainer, 0)

    def on_iteration(self, trainer, iteration: int) -> None:
        """Measure at every multiple of the interval."""
        if iteration % self.interval == 0:
            self._log(trainer, iteration)

    def _log(self, trainer, iteration: int) -> None:
        figures = self.probe.measure(trainer.chunks[0])
        line = f"[probe] iter {iteration} | copy acc {figures['probe_copy_accuracy']:.3f}"
        if "probe_in_context_score" in figures:
            line += f" | in-context score {figures['probe_in_context_score']:+.3f}"
        if "probe_text_copy_accuracy" in figures:
            line += (f" | text copy acc {figures['probe_text_copy_accuracy']:.3f} (first occurrence "
                     f"{figures['probe_text_copy_first_accuracy']:.3f})")
        trainer.print(line)
        trainer.logger.log({"iteration": iteration, **figures})


def probe_callbacks(cfg) -> list:
    """The callbacks a run's config asks for (`train.probe_interval` > 0: the probe)."""
    t = cfg.train
    if not t.probe_interval:
        return []
    length = min(t.probe_copy_length, cfg.model.max_position_embeddings)
    return [ProbeCallback(t.probe_interval, t.probe_sequences, length)]
