"""benchmarks/data_prep.py: a small run reports every stage consistently, and docs/data.md's core-hours for 100B
tokens is the committed measurement's."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.data_prep"  # run as users do: python -m, from the checkout's root
COMMITTED = REPO / "results" / "data_prep_cpu.json"
STAGES = ["read", "read_jsonl_zst", "tokenize", "write", "prepare"]


def test_small_run_reports_every_stage(tmp_path, stdlib_corpus):
    out = tmp_path / "data_prep.json"
    result = subprocess.run([sys.executable, "-m", MODULE, "--reps", "1", "--max-bytes", "150000", "--corpus",
                             str(stdlib_corpus.root), "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["complete"] and list(report["stages"]) == STAGES
    stages = report["stages"]
    tokens = stages["prepare"]["tokens"]
    assert tokens > 10_000 and all(s["tokens"] == tokens for s in stages.values())  # every stage saw the same text
    for name, s in stages.items():
        assert s["tokens_per_core_s"] > 0 and s["cpu_s_median"] > 0, name
        assert abs(s["core_hours_per_100b_tokens"] - 1e11 / s["tokens_per_core_s"] / 3600) < 0.1, name
    # the whole pipeline costs at least its tokenizing (it includes it)
    assert stages["prepare"]["core_hours_per_100b_tokens"] >= 0.8 * stages["tokenize"]["core_hours_per_100b_tokens"]
    assert "core-h per 100B tokens" in result.stdout


def test_the_data_page_states_the_committed_core_hours():
    report = json.loads(COMMITTED.read_text())
    assert report["complete"] and report["environment"]["cpus_allowed"] == [0]  # measured pinned to one core
    assert report["environment"]["files"] > 500  # the whole training split of the embedded corpus
    stages = report["stages"]
    page = (REPO / "docs" / "data.md").read_text()
    section = page.split("### Throughput", 1)[1].split("\n## ", 1)[0]
    prepare = stages["prepare"]["core_hours_per_100b_tokens"]
    assert re.search(rf"\*\*{prepare:,.0f} core-hours\*\* per 100B tokens", section), prepare
    for stage in ("tokenize", "write"):
        assert f"{stages[stage]['tokens_per_core_s'] / 1e3:,.0f}k tokens/s" in section, stage
