"""A training run's record: one launch's throughput and layout, written by rank 0 at its end to
RUN_DIR/run_record.json (a launch stopped early, exit 75: run_record_stopped_early.json; its run is not finished).
Scaling studies aggregate these; an experiment counts a run as trained when it has one.

Runs written before the record had its own name call it summary.json (summary_stopped_early.json); the reader
takes either. The name "summary.json" now means a study's aggregate only.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.errors import UserError, check_version

RUN_RECORD = "run_record.json"
RUN_RECORD_STOPPED = "run_record_stopped_early.json"
LEGACY_NAMES = {RUN_RECORD: "summary.json", RUN_RECORD_STOPPED: "summary_stopped_early.json"}
RUN_RECORD_VERSION = 1  # records without a version (the legacy names) are version 1


class RunRecordError(UserError):
    """A run record that cannot be read; names the file and the fix."""


@dataclass(frozen=True)
class Layout:
    """The parallel layout a launch ran with."""

    tp: int
    pp: int
    dp: int
    vpp: int | None
    sp: bool
    world_size: int
    cp: int = 1


@dataclass(frozen=True)
class RunRecord:
    """One launch's throughput record."""

    preset: str
    copy_head: bool
    layout: Layout
    nodes: int
    device: str
    seq_len: int
    global_batch: int
    iterations: int
    tokens_per_sec: float | None
    tflops_per_device: float | None
    mfu: float | None
    step_time: float | None
    peak_memory_gib: float
    flops_per_token: float
    config_hash: str
    stopped_early: bool = False
    # the rates above are over these steps: every step after the launch's first logged interval (its warm-up),
    # or all of them when it logged once (includes_warmup)
    measured_steps: int | None = None
    includes_warmup: bool = False
    lm_head_loss: str | None = None  # the LM-head loss path the run resolved (model.lm_head_loss)
    # flops_per_token above counts what the hardware computes (a recomputed forward included); these are the
    # model's own (no recompute) and the hardware's with causal attention (model/accounting.train_flops_figures)
    model_flops_per_token: float | None = None
    causal_flops_per_token: float | None = None
    memory_estimate_gib: float | None = None  # the planner's estimate per process (tools/model_info.py's)
    version: int = RUN_RECORD_VERSION

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_record_path(run_dir: Path, stopped_early: bool = False) -> Path | None:
    """The run dir's record file (its current name, else the legacy one), None when it has none."""
    name = RUN_RECORD_STOPPED if stopped_early else RUN_RECORD
    for candidate in (name, LEGACY_NAMES[name]):
        if (Path(run_dir) / candidate).is_file():
            return Path(run_dir) / candidate
    return None


def has_run_record(run_dir: Path) -> bool:
    """Whether a run finished training (its record of a complete launch exists, under either name)."""
    return run_record_path(run_dir) is not None


def parse_run_record(path: Path, data: Any) -> RunRecord:
    """A RunRecord from a record file's content; RunRecordError naming the file and the missing key."""
    if not isinstance(data, dict):
        raise RunRecordError(f"{path} is not a run record (a JSON object written by the trainer)")
    check_version(path, data, "a run record", RUN_RECORD_VERSION, RunRecordError,
                  "read it with the cplm_megatron that wrote it")
    fields = {f.name for f in dataclasses.fields(RunRecord)}
    required = [f.name for f in dataclasses.fields(RunRecord) if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise RunRecordError(f"{path}: missing key {missing[0]!r} (is it a trainer's run record?)")
    try:
        layout = data["layout"]
        layout = Layout(**{k: layout[k] for k in ("tp", "pp", "dp", "vpp", "sp", "world_size")},
                        cp=int(layout.get("cp", 1)))
        return RunRecord(**{k: v for k, v in data.items() if k in fields and k != "layout"}, layout=layout)
    except KeyError as e:
        raise RunRecordError(f"{path}: missing key {e} (is it a trainer's run record?)") from None
    except TypeError as e:
        raise RunRecordError(f"{path}: not a run record ({e})") from None


def read_run_record(path: Path) -> RunRecord:
    """A run record from its file, or from a run dir (its record of a complete launch, under either name)."""
    path = Path(path)
    if path.suffix != ".json":  # a run dir
        found = run_record_path(path)
        if found is None:
            raise RunRecordError(f"{path} has no {RUN_RECORD} (nor a legacy summary.json): the run did not finish; "
                                 "relaunch it to resume")
        path = found
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunRecordError(f"{path} is not a readable run record ({e})") from None
    return parse_run_record(path, data)


def write_run_record(run_dir: Path, record: RunRecord) -> Path:
    """Write the record under its name (stopped early or complete); returns the path."""
    path = Path(run_dir) / (RUN_RECORD_STOPPED if record.stopped_early else RUN_RECORD)
    path.write_text(json.dumps(record.to_json(), indent=2))
    return path
