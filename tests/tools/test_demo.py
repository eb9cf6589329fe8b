"""`make demo`'s steps, shortened (--smoke): TP=2 training of both models, evaluation, report, HF export,
generation from the export, summary. The full demo's timing is reported in the README. The demo's corpus
ablation is also the test of the ablation report (tools/ablate.py --experiments corpus): its sections,
plots and per-checkpoint evaluations are checked here."""
import json
import re
from pathlib import Path

import pytest

from tests import harness

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated_streaming")]


def test_demo_smoke_runs_every_step(stdlib_corpus, tmp_path):
    out = tmp_path / "demo"
    proc = harness.run_tool("demo", "--smoke", "--data", str(stdlib_corpus.root), "--output", str(out), timeout=1200,
                            env={"PYTHONWARNINGS": ""})  # Python's default filters, as a user's shell has them
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert Path(summary["report"]).is_file() and (Path(summary["hf_model"]) / "config.json").is_file()
    assert summary["sample"].startswith(summary["prompt"]) and len(summary["sample"]) > len(summary["prompt"])
    assert summary["spamlang"] and "SpamLang vocab 4096" in summary["spamlang"][0]
    assert [r["model"] for r in summary["headline"]] == ["baseline", "CPLM"]
    assert all(r["val_loss"] > 0 and 0 <= r["copy_accuracy"] <= 1 for r in summary["headline"])
    log = out / "ablation" / "runs" / "corpus-baseline" / "train.log"  # progress names the log of the first run
    assert re.search(rf"^\[ablate\] run 1 of 4, corpus-baseline: training: .*\(log {re.escape(str(log))}\)$",
                     proc.stdout, flags=re.M), proc.stdout[-3000:]
    done = re.findall(r"^\[ablate\] run (\d) of 4, \S+: done \(train \d+ s, eval \d+ s\)(; overall ETA \d:\d\d:\d\d)?$",
                      proc.stdout, flags=re.M)
    assert [k for k, _ in done] == ["1", "2", "3", "4"] and all(eta for _, eta in done), proc.stdout[-3000:]
    # no JSON, no warnings, no progress bars, no [compat] line
    assert not re.search(r"^\s*\{|Warning|it/s\]|^\[compat\]", proc.stdout + proc.stderr, flags=re.M), proc.stderr
    summary_part = proc.stdout[proc.stdout.index("=== 5. summary ==="):]
    assert summary_part.splitlines()[1].split() == ["model", "val", "loss", "copy", "acc.", "passkey", "(key", "tokens)"]
    report = Path(summary["report"]).read_text()
    assert "corpus-cplm" in report and "tp=2" in report
    hf_config = json.loads((Path(summary["hf_model"]) / "config.json").read_text())
    assert hf_config["model_type"] == "cplm" and "auto_map" in hf_config
    # the corpus ablation's report (the demo runs it with --corpus-iters 6 --corpus-interval 3)
    assert "## Embedded corpus" in report and "Passkey operating points, CPLM" in report
    assert (out / "ablation" / "passkey.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    evals = json.loads((out / "ablation" / "runs" / "corpus-cplm" / "eval.json").read_text())["checkpoints"]
    assert [e["iteration"] for e in evals] == [0, 3, 6]
    assert set(evals[-1]["tasks"]) == {"val", "copy", "passkey", "gradient"}
