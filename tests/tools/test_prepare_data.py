"""tools/prepare_data.py as users run it: summary, manifest, "up to date" reruns, killed runs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cplm_megatron.data.manifest import read_manifest
from tests.data_fixtures import TinyCorpus, load_tool, subprocess_env

REPO = Path(__file__).resolve().parents[2]


def run_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict | None, str]:
    code = load_tool("prepare_data").main(list(args))
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def test_cli_writes_manifest_and_skips_unchanged_reruns(tmp_path: Path, tiny_corpus: TinyCorpus,
                                                        capsys: pytest.CaptureFixture) -> None:
    text = tmp_path / "lines.txt"
    text.write_text("first line\n\nsecond line\nthird line\n")
    out = tmp_path / "ds"
    args = ("--input", str(text), "--tokenizer", str(tiny_corpus.tokenizer_dir), "--output", str(out),
            "--seq-len", "8", "--split-by", "line", "--workers", "2", "--quiet")
    code, summary, err = run_main(capsys, *args)
    assert code == 0, err
    assert summary["status"] == "written" and summary["documents"] == 3 and summary["seq_len"] == 8
    manifest = read_manifest(str(out))
    assert (manifest.documents, manifest.samples, manifest.tokens) == (3, summary["samples"], summary["tokens"])
    assert manifest.tokenizer == tiny_corpus.tokenizer and manifest.source_files == [str(text)]
    assert manifest.settings["split_by"] == "line" and manifest.settings["empty_documents_skipped"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "manifest.json", "shard.00000.mds.zstd"]
    code, again, _ = run_main(capsys, *args)
    assert code == 0 and again["status"] == "up to date"


def test_killed_run_leaves_nothing_that_looks_complete(tmp_path: Path, tiny_corpus: TinyCorpus,
                                                       capsys: pytest.CaptureFixture) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f.read_text() for f in tiny_corpus.source_files) * 8)  # ~2.4 MB: a few seconds
    out = tmp_path / "ds"
    args = ("--input", str(corpus), "--tokenizer", str(tiny_corpus.tokenizer_dir), "--output", str(out),
            "--seq-len", "64", "--workers", "1", "--split-by", "paragraph", "--shard-size", "64kb", "--quiet")
    proc = subprocess.Popen([sys.executable, "tools/prepare_data.py", *args], cwd=REPO, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".ds.tmp-*/shard.*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the build finished before it could be interrupted; use a larger input"
    os.kill(proc.pid, signal.SIGKILL)  # in the middle of writing shards
    proc.wait()
    assert not out.exists()  # the partial build lives only in the hidden temporary directory
    assert list(tmp_path.glob(".ds.tmp-*/shard.*"))
    code, summary, err = run_main(capsys, *args)
    assert code == 0, err
    assert summary["status"] == "written" and read_manifest(str(out)).documents > 0
    assert not list(tmp_path.glob(".ds.tmp-*"))  # the stale temporary was cleaned up


def test_cli_errors_name_the_problem(tmp_path: Path, tiny_corpus: TinyCorpus, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "a.txt").write_text("x = 1\n")
    code, _, err = run_main(capsys, "--input", str(tmp_path / "a.txt"), "--tokenizer", str(tmp_path),
                            "--output", str(tmp_path / "o"), "--seq-len", "8")
    assert code == 2 and err.startswith("error: ") and "is not a tokenizer directory" in err
    (tmp_path / "empty.jsonl").write_text("")
    code, _, err = run_main(capsys, "--input", str(tmp_path / "empty.jsonl"), "--tokenizer",
                            str(tiny_corpus.tokenizer_dir), "--output", str(tmp_path / "o"), "--seq-len", "8")
    assert code == 2 and "holds no documents" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_rerun_repairs_a_damaged_dataset(tmp_path: Path, tiny_corpus: TinyCorpus, capsys: pytest.CaptureFixture,
                                         damage: str) -> None:
    """The same command after a shard was damaged checks the shards against index.json and rebuilds,
    byte-identical to the first build, instead of calling the broken dataset "up to date"."""
    out = tmp_path / "ds"
    args = ("--input", *map(str, tiny_corpus.source_files[:20]), "--tokenizer", str(tiny_corpus.tokenizer_dir),
            "--output", str(out), "--seq-len", "32", "--shard-size", "16kb", "--workers", "1", "--quiet")
    code, summary, err = run_main(capsys, *args)
    assert code == 0 and summary["status"] == "written", err
    original = {p.name: p.read_bytes() for p in out.iterdir()}
    shard = sorted(out.glob("shard.*.mds.zstd"))[1]
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        shard.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        shard.unlink()
    code, summary, err = run_main(capsys, *args)
    assert code == 0 and summary["status"] == "repaired", err
    assert "damaged and has been rebuilt" in err and shard.name in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == original
    code, summary, _ = run_main(capsys, *args)
    assert code == 0 and summary["status"] == "up to date"


def test_binary_input_is_refused_unless_allowed(tmp_path: Path, tiny_corpus: TinyCorpus,
                                                capsys: pytest.CaptureFixture) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("def f():\n    return 1\n" * 20)
    binary = tmp_path / "weights.txt"
    binary.write_bytes(bytes(range(256)) * 16)  # a binary file named .txt: half its bytes are not UTF-8
    args = ("--input", str(text), str(binary), "--tokenizer", str(tiny_corpus.tokenizer_dir),
            "--output", str(tmp_path / "ds"), "--seq-len", "8", "--quiet")
    code, _, err = run_main(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {binary}: 50% of its 4,096 bytes are not text")
    assert "--max-invalid-utf8 0.51" in err and not (tmp_path / "ds").exists()
    code, summary, err = run_main(capsys, *args, "--max-invalid-utf8", "0.51")
    assert code == 0 and summary["documents"] == 2, err
    assert read_manifest(str(tmp_path / "ds")).settings["documents_with_invalid_utf8"] == 1


def test_cli_parts_report_progress_and_merge(tmp_path: Path, tiny_corpus: TinyCorpus,
                                             capsys: pytest.CaptureFixture) -> None:
    files = tmp_path / "files.txt"
    files.write_text("\n".join(map(str, tiny_corpus.source_files[:12])) + "\n")
    out = tmp_path / "ds"
    common = ("--input", f"@{files}", "--tokenizer", str(tiny_corpus.tokenizer_dir), "--output", str(out),
              "--seq-len", "32", "--workers", "1", "--progress-every", "0")
    documents = 0
    for i in (1, 2):
        code, summary, err = run_main(capsys, *common, "--part", f"{i}/2")
        assert code == 0, err
        assert summary["status"] == "written" and summary["part"] == f"{i}/2"
        assert summary["output"] == str(out / f"part-0000{i}-of-00002")
        # a job log (stderr is no terminal): a start line, progress lines and a last line, all naming the part
        lines = err.splitlines()
        assert lines[0] == f"[prepare_data] part {i}/2: {summary['files']} input files -> {summary['output']}"
        assert lines[-1].startswith(f"[prepare_data] part {i}/2: done, {summary['samples']:,} samples: "
                                    f"{summary['documents']:,} documents, {summary['tokens']:,} tokens")
        assert all(line.startswith(f"[prepare_data] part {i}/2: ") for line in lines)
        documents += summary["documents"]
    # the merge in a fresh interpreter, as the SLURM job runs it (streaming must load without torchvision)
    merged = subprocess.run([sys.executable, "tools/prepare_data.py", "--merge", "--output", str(out), "--parts", "2"],
                            cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300, check=False)
    code, summary, err = merged.returncode, json.loads(merged.stdout or "null"), merged.stderr
    nonempty = sum(bool(f.read_text().strip()) for f in tiny_corpus.source_files[:12])
    assert code == 0 and summary["status"] == "merged" and summary["documents"] == documents == nonempty, err
    assert read_manifest(str(out)).documents == nonempty
    code, summary, _ = run_main(capsys, *common, "--part", "2/2", "--quiet")
    assert code == 0 and summary["status"] == "up to date"
    code, summary, _ = run_main(capsys, "--merge", "--output", str(out))
    assert code == 0 and summary["status"] == "up to date"


@pytest.mark.parametrize("args, message", [
    (("--part", "0/3"), "error: --part 0/3: need 1 <= I <= N"),
    (("--part", "2"), "error: --part '2' is not I/N"),
    (("--merge",), "holds no part-IIIII-of-NNNNN directories"),
    (("--merge", "--part", "1/2"), "error: --merge takes only --output (and --parts N); drop --input and --part"),
    (("--parts", "2"), "error: --parts goes with --merge"),
    (("--input", "corpus/*.zz"), "error: input pattern 'corpus/*.zz' matches no supported files"),
])
def test_cli_part_and_merge_errors_are_one_line(tmp_path: Path, tiny_corpus: TinyCorpus,
                                                capsys: pytest.CaptureFixture, args: tuple, message: str) -> None:
    base = ["--input", str(tiny_corpus.source_files[0]), "--tokenizer", str(tiny_corpus.tokenizer_dir),
            "--output", str(tmp_path), "--seq-len", "8"]
    if args[0] == "--merge" and len(args) == 1:
        base = ["--output", str(tmp_path)]
    if args[0] == "--input":
        base = base[2:]
    code, _, err = run_main(capsys, *base, *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err
