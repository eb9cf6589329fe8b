"""The GPU study's record: WORK_DIR/study.json, rewritten after every phase (a budget cut keeps what finished), and
the phases timed into it."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.gpu_study.sizes import Sizes

STUDY_RECORD = "study.json"
NOTE = ("val_loss: mean NLL of the model's full distribution (the mixture for the CPLM) on val_sequences "
        "samples spread across the validation split; probes: probe_copy_accuracy (the copy task's "
        "repeats, beside 1/(V-1)) and probe_in_context_score (NLL at context positions [T/2, T) minus "
        "[T/16, T/8) on the validation batches; negative: the model uses its context) every "
        "probe_interval steps from step 0; controls: the baseline + continuous cache (Grave et al. "
        "2017; lambda/theta tuned on the dev split), copy chance and the one-token-match copier, "
        "passkey chance; comparisons: paired over the same validation documents, 95% document "
        "bootstrap")


class Record:
    """WORK_DIR/study.json, rewritten (through a temporary and a rename) after every phase."""

    def __init__(self, work: Path, sizes: Sizes, tiny: bool, budget: float):
        self.path = work / STUDY_RECORD
        self.data: dict[str, Any] = {
            "dry_run": tiny, "complete": False, "budget_s": budget, "sizes": asdict(sizes), "estimate": None,
            "phases": {}, "corpus": None, "arms": {}, "equal_tokens": None, "controls": {}, "comparisons": {},
            "note": NOTE}
        self.write()

    def phase(self, name: str, seconds: float, ok: bool, error: str | None = None) -> None:
        """Record one phase's time and outcome."""
        self.data["phases"][name] = {"seconds": round(seconds, 1), "ok": ok, **({"error": error} if error else {})}
        self.write()

    def write(self) -> None:
        """Rewrite study.json whole."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(self.path)


def run_phase(record: Record, name: str, body: Callable[[], None]) -> bool:
    """Time `body`, record it (an exception is the phase's error, not the script's end)."""
    start = time.perf_counter()
    print(f"[study] {name}: start", flush=True)
    try:
        body()
    except Exception as err:  # noqa: BLE001 - one phase's failure is recorded; later phases may still run
        import traceback

        traceback.print_exc()
        record.phase(name, time.perf_counter() - start, False, f"{type(err).__name__}: {err}")
        print(f"[study] {name}: failed: {type(err).__name__}: {err}", flush=True)
        return False
    record.phase(name, time.perf_counter() - start, True)
    print(f"[study] {name}: done in {time.perf_counter() - start:.1f} s", flush=True)
    return True
