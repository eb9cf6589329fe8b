"""tools/train_tokenizer.py as users run it: mixed inputs, HF-loadable output, idempotent reruns."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstd

from tests.data_fixtures import load_tool, subprocess_env

REPO = Path(__file__).resolve().parents[2]


def test_cli_trains_a_loadable_tokenizer_and_skips_unchanged_reruns(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "corpus").mkdir()
    code = (REPO / "cplm_megatron" / "data" / "packing.py").read_text()
    (tmp_path / "corpus" / "a.py").write_text(code)
    records = "".join(json.dumps({"text": line}) + "\n" for line in code.splitlines() if line.strip())
    (tmp_path / "corpus" / "b.jsonl.zst").write_bytes(zstd.compress(records.encode()))
    out = tmp_path / "tok"
    args = ["--input", str(tmp_path / "corpus"), "--vocab-size", "300", "--output", str(out), "--eod-token", "<eod>",
            "--quiet"]
    tool = load_tool("train_tokenizer")
    assert tool.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "trained" and summary["vocab_size"] == 300 and summary["eod_token"] == "<eod>"

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    assert (tok.eos_token, tok.bos_token, tok.eos_token_id) == ("<eod>", "<eod>", 0)
    assert tok.decode(tok.encode("def add_document(self):", add_special_tokens=False)) == "def add_document(self):"
    record = json.loads((out / "cplm_tokenizer.json").read_text())
    assert [Path(p).name for p in record["source_files"]] == ["a.py", "b.jsonl.zst"]

    assert tool.main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["status"] == "up to date" and again["sha256"] == summary["sha256"]


def test_script_reports_bad_input_without_a_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "tools/train_tokenizer.py", "--input", str(tmp_path / "missing"),
                           "--vocab-size", "300", "--output", str(tmp_path / "tok")],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: input path does not exist:") and "Traceback" not in proc.stderr
    assert not (tmp_path / "tok").exists()


def test_max_docs_trains_on_a_deterministic_sample_of_the_same_inputs(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """Each file holds lines of one made-up word; with --max-docs only the sampled documents' words are learned."""
    from cplm_megatron.data.inputs import sample_files

    corpus = tmp_path / "corpus"
    words = {}
    for k in range(30):
        letters = "bcdfghjklmnpqrstvwxz"
        word = "qz" + letters[k % 20] + letters[k // 20] + letters[(k * 7) % 20] + "vx"  # unique per file
        words[corpus / f"d{k % 3}" / f"f{k:02d}.txt"] = word
    for path, word in words.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{word} {word}\n" for _ in range(10)))
    out = tmp_path / "tok"
    args = ["--input", str(corpus / "**" / "*.txt"), "--vocab-size", "320", "--output", str(out), "--split-by",
            "line", "--max-docs", "25", "--quiet"]
    tool = load_tool("train_tokenizer")
    assert tool.main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    record = json.loads((out / "cplm_tokenizer.json").read_text())
    chosen, _ = sample_files([str(corpus / "**" / "*.txt")], 25)
    used = chosen[:3]  # 10 lines per file: 25 documents come from the first three files in hash order
    assert record["documents"] == 25 and record["source_files"] == [str(p) for p in chosen]
    assert record["settings"]["max_docs"] == 25
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    learned = {path for path, word in words.items() if word in vocab or "Ġ" + word in vocab}
    assert learned == set(used), (sorted(learned), used)
    assert tool.main(args) == 0 and json.loads(capsys.readouterr().out)["status"] == "up to date"
    (corpus / "d0" / "new.txt").write_text("another file changes the listing\n")
    assert tool.main(args) == 0 and json.loads(capsys.readouterr().out)["status"] == "trained"
    assert tool.main([*args[:-3], "--max-docs", "0", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: --max-docs must be >= 1")
