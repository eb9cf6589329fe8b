"""Run logging from one rank: a console line per interval, RUN_DIR/metrics.jsonl, optional TensorBoard and wandb.

A training record's `loss` is the NLL of the model's output distribution (the mixture's for a CPLM, the LM head's
for a baseline: the quantity validation reports and the one to compare), `objective` what the optimizer
minimizes, `lm_loss` the LM head's own cross entropy. Records written before `objective` existed named the
objective `loss` and the NLL `mix_loss`: read them with `record_nll` / `record_objective`."""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from cplm_megatron.durable_files import append_line, read_json_lines, write_atomic

METRICS_FILE = "metrics.jsonl"  # a run's training and validation records, one JSON object per line

if TYPE_CHECKING:
    from cplm_megatron.run_config import LoggingConfig


TENSORBOARD_DIR = "tensorboard"


def read_metrics(run: Path) -> List[Dict[str, Any]]:
    """The records of a run's metrics.jsonl (`run`: the run dir, or the file itself, e.g. a copy); none if it is
    missing; a line cut short by an interrupted write is left out (a reader of a run that is still training, or was
    killed mid-write, sees whole records only). This module writes the file; every reader reads it here."""
    path = Path(run)
    return read_json_lines(path if path.suffix == ".jsonl" else path / METRICS_FILE).records

def record_nll(rec: Dict[str, Any]) -> float:
    """The comparable NLL of a training record of any version (older records: `mix_loss`, else `loss`)."""
    return rec["loss"] if "objective" in rec else rec.get("mix_loss", rec["loss"])


def record_objective(rec: Dict[str, Any]) -> float:
    """The optimized objective of a training record of any version."""
    return rec.get("objective", rec["loss"])


def objective_terms(lm_loss_weight: float, copy_loss_weight: float) -> Optional[str]:
    """How the objective is made of the logged terms (`loss + 1×lm-head`), or None where it is `loss` itself."""
    terms = [f"{w:g}×{name}" for w, name in ((lm_loss_weight, "lm-head"), (copy_loss_weight, "copy")) if w]
    return " + ".join(["loss", *terms]) if terms else None


def format_line(rec: Dict[str, Any], total_iters: int, terms: Optional[str] = None) -> str:
    """The console line for one logged iteration; `terms` (objective_terms) labels the objective where it differs
    from `loss`."""
    parts = [f"iter {rec['iteration']}/{total_iters}", f"loss {record_nll(rec):.4f}"]
    if terms:
        parts += [f"lm-head {rec['lm_loss']:.4f}", f"objective {record_objective(rec):.4f} ({terms})"]
    if rec.get("gate_mean") is not None:
        parts.append(f"gate {rec['gate_mean']:.3f}")
    parts.append(f"lr {rec['lr']:.2e}")
    if rec.get("grad_norm") is not None:
        parts.append(f"gnorm {rec['grad_norm']:.3f}")
    if rec.get("mem_gib") is not None:
        label = "mem" if rec.get("mem_device") == "cuda" else "host mem"
        parts.append(f"{label} {rec['mem_gib']:.2f}/{rec['peak_mem_gib']:.2f} GiB")
    if "tokens_per_sec" in rec:
        parts += [
            f"tok/s {rec['tokens_per_sec']:,.0f}",
            f"TFLOP/s/dev {rec['tflops_per_device']:.3f}",
            f"MFU {100 * rec['mfu']:.2f}%",
        ]
        if rec.get("warmup"):
            parts[-3] += " (warm-up)"
        if rec.get("eta_sec") is not None:
            parts.append(f"ETA {datetime.timedelta(seconds=int(rec['eta_sec']))}")
    if rec.get("skipped_steps"):
        parts.append(f"skipped {rec['skipped_steps']}")
    return " | ".join(parts)


class MetricsLogger:
    """Writes metrics on the logging rank only; every method is a no-op elsewhere."""

    def __init__(self, run_dir: Path, cfg: "LoggingConfig", config: Dict[str, Any], active: bool,
                 resume_iteration: int = 0, run_name: str = ""):
        self.active = active
        self.path = Path(run_dir) / METRICS_FILE
        self._wandb = None
        self._tensorboard = None
        self._skipped: list = []  # iterations whose record a failed write skipped
        if not active:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_after(resume_iteration)
        if cfg.tensorboard:
            self._tensorboard = _init_tensorboard(Path(run_dir), resume_iteration)
        if cfg.wandb and cfg.wandb_mode != "disabled":
            self._wandb = _init_wandb(Path(run_dir), cfg, config, run_name)

    def _truncate_after(self, iteration: int) -> None:
        """Drop records past the resumed checkpoint (they are about to be recomputed) and lines cut short by an
        interrupted write (a full disk, a kill), said in one line."""
        if not self.path.exists():
            return
        found = read_json_lines(self.path)
        if found.bad_lines:
            print(f"[train] {found.note(self.path)}", flush=True)
        keep = [r for r in found.records if r.get("iteration", 0) <= iteration]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in keep))

    def log(self, record: Dict[str, Any]) -> None:
        if not self.active:
            return
        self._append(record)
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tensorboard is not None:
            for key, value in numbers.items():
                if key != "iteration":
                    self._tensorboard.add_scalar(key, value, global_step=record["iteration"])
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=record["iteration"])

    def _append(self, record: Dict[str, Any]) -> None:
        """One line of metrics.jsonl, whole or not at all: a failed write (a full disk) skips the record with one
        line the first time, and says how many were skipped once writing works again (a resume from the last
        checkpoint logs the lost iterations again)."""
        try:
            append_line(self.path, json.dumps(record))
        except OSError as e:
            if not self._skipped:
                print(f"[train] cannot write {self.path} ({e.strerror or e}): skipping its records until it can be "
                      f"written; the checkpoints are not affected", flush=True)
            self._skipped.append(record.get("iteration"))
            return
        if self._skipped:
            print(f"[train] {self.path} is writable again: {len(self._skipped)} record(s) were skipped (iterations "
                  f"{self._skipped[0]}-{self._skipped[-1]})", flush=True)
            self._skipped = []

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _init_tensorboard(run_dir: Path, resume_iteration: int):
    """A TensorBoard writer into RUN_DIR/tensorboard (LoggingConfig.validate checked the package is installed); a
    resumed run's events past its checkpoint are dropped, as its metrics.jsonl records are."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=resume_iteration + 1)


def _init_wandb(run_dir: Path, cfg: "LoggingConfig", config: Dict[str, Any], name: str):
    """wandb run (offline by default) whose id is stable across restarts of the same run directory."""
    import secrets

    import wandb

    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(6)
    id_file.write_text(run_id)
    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(
        project=cfg.wandb_project, entity=cfg.wandb_entity, name=name or run_dir.name, id=run_id,
        resume="allow", dir=str(run_dir), mode=cfg.wandb_mode, config=config,
    )


def rank0_print(message: str, rank: Optional[int] = None) -> None:
    """Print from global rank 0 only (flush: logs are tailed by SLURM/tests)."""
    import torch.distributed as dist

    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(message, flush=True)


def stop_wandb_service() -> None:
    """Stop wandb's service process (if this process started one) before a failing run kills its helpers: killed
    from under it, wandb's atexit hook prints a `Connection lost` traceback after the run's one error line."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is None:
        return
    try:
        wandb.teardown()
    except (Exception, SystemExit):  # noqa: BLE001 - best effort: the run has failed already
        pass
