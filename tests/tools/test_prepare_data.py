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


@pytest.mark.parametrize("flags, message", [
    (("--seq-len", "0"), "--seq-len must be >= 1, got 0"),
    (("--workers", "-2"), "--workers must be >= 1, got -2"),
    (("--shard-size", "abc"), "--shard-size must be a size from 1b to under 4gb (e.g. 64mb), got 'abc'"),
    (("--shard-size", "0"), "--shard-size must be a size from 1b to under 4gb (e.g. 64mb), got '0'"),
    (("--shard-size", "5gb"), "--shard-size must be a size from 1b to under 4gb (e.g. 64mb), got '5gb'"),
], ids=["seq-len", "workers", "shard-size", "shard-size-0", "shard-size-big"])
def test_numeric_flags_out_of_range_are_one_line(tmp_path: Path, tiny_corpus: TinyCorpus,
                                                 capsys: pytest.CaptureFixture, flags, message) -> None:
    """--seq-len 0 and --shard-size abc/5gb were tracebacks (exit 1) from the packer and the shard writer,
    --shard-size 0 wrote one unbounded shard and --workers -2 ran as 1: each is one line, exit 2, nothing written."""
    (tmp_path / "a.txt").write_text("x = 1\n")
    args = {"--seq-len": "8", "--workers": "1", **dict([flags])}
    code, _, err = run_main(capsys, "--input", str(tmp_path / "a.txt"), "--tokenizer", str(tiny_corpus.tokenizer_dir),
                            "--output", str(tmp_path / "o"), "--quiet", *[x for kv in args.items() for x in kv])
    assert (code, err) == (2, f"error: {message}\n")
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


@pytest.mark.mcore  # megatron-core writes the Megatron dataset and the trainer reads the four
def test_jsonl_parquet_a_datasets_folder_and_megatron_data_give_the_same_shards_and_train(
        tmp_path: Path, tiny_corpus: TinyCorpus, capsys: pytest.CaptureFixture, isolated_streaming) -> None:
    """The tiny corpus's documents as JSON lines and Parquet (`--text-field content`), a `datasets` save_to_disk folder and
    a Megatron .bin/.idx of their ids (tokenized by transformers, EOD-terminated as preprocess_data.py writes
    them): four identical sets of shards; then a few training steps read all four (validated on one)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from tests import harness
    from tests.data.test_importers import megatron_dataset

    texts = [text for text in (f.read_text() for f in tiny_corpus.source_files) if text.strip()]
    assert len(texts) > 20
    src = tmp_path / "src"
    src.mkdir()
    (src / "docs.jsonl").write_text("".join(json.dumps({"id": i, "content": t}) + "\n" for i, t in enumerate(texts)))
    pq.write_table(pa.table({"content": texts}), src / "docs.parquet")
    datasets.Dataset.from_dict({"content": texts}).save_to_disk(str(src / "saved"), num_shards=2)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_corpus.tokenizer_dir))
    eod = tiny_corpus.tokenizer.eod_id
    megatron_dataset(src / "docs_text_document", [[tokenizer(t, add_special_tokens=False).input_ids + [eod]]
                                                  for t in texts])
    outputs = {}
    for name, given in (("jsonl", "docs.jsonl"), ("parquet", "docs.parquet"), ("saved", "saved"),
                        ("megatron", "docs_text_document")):
        outputs[name] = tmp_path / name
        code, summary, err = run_main(capsys, "--input", str(src / given), "--tokenizer", str(tiny_corpus.tokenizer_dir),
                                      "--output", str(outputs[name]), "--seq-len", "64", "--text-field", "content",
                                      "--workers", "1", "--quiet")
        assert code == 0 and summary["documents"] == len(texts), err
    shards = {name: {p.name: p.read_bytes() for p in out.iterdir() if p.name != "manifest.json"}
              for name, out in outputs.items()}
    assert shards["jsonl"] and all(files == shards["jsonl"] for files in shards.values())
    assert read_manifest(str(outputs["megatron"])).settings["sources"][0]["kind"] == "megatron_indexed"
    assert read_manifest(str(outputs["saved"])).settings["sources"][0]["kind"] == "hf_saved_dataset"

    run = tmp_path / "run"
    streams = "[" + ",".join(str(p) for p in outputs.values()) + "]"
    proc = harness.run_pretrain(1, [
        f"run.dir={run}", f"model.vocab_size={tiny_corpus.tokenizer.vocab_size}", "copy_head.head_dim=16",
        "train.iters=3", "train.seq_len=64", "train.micro_batch=2", "train.global_batch=4", "train.log_interval=1",
        "train.eval_interval=3", "train.eval_iters=1", "schedule.warmup_iters=1", "checkpoint.enabled=false",
        f"data.streams={streams}", f"data.val_streams=[{outputs['saved']}]", "logging.wandb=false"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "consumed_tokens" in r]
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses)
    assert [r["iteration"] for r in records if "val_loss" in r] == [3]


@pytest.mark.parametrize("case, message", [
    ("saved without the field", "no column 'text' (columns: ['content']); choose the column with --text-field"),
    ("empty saved dataset", "the input holds no documents"),
    ("datasets dict", "is a datasets DatasetDict with splits train: pass one split's folder"),
    ("megatron without .bin", "a Megatron indexed dataset needs x.idx and x.bin side by side"),
    ("part of a saved dataset", "--part splits text files between jobs; a datasets folder or a Megatron dataset"),
])
def test_imported_inputs_bad_input_is_one_line(tmp_path: Path, tiny_corpus: TinyCorpus,
                                               capsys: pytest.CaptureFixture, case: str, message: str) -> None:
    import datasets

    rows = {"content": [] if case == "empty saved dataset" else ["some text"]}
    datasets.Dataset.from_dict(rows, features=datasets.Features({"content": datasets.Value("string")})).save_to_disk(
        str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "x.idx").write_bytes(b"")
    capsys.readouterr()  # datasets' own progress bars
    given = {"datasets dict": "dict", "megatron without .bin": "x"}.get(case, "saved")
    extra = {"empty saved dataset": ["--text-field", "content"], "part of a saved dataset": ["--part", "1/2"]}
    code, _, err = run_main(capsys, "--input", str(tmp_path / given), "--tokenizer", str(tiny_corpus.tokenizer_dir),
                            "--output", str(tmp_path / "out"), "--seq-len", "8", "--quiet", *extra.get(case, []))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "out").exists()
