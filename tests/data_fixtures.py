"""Fixtures and helpers for data tests (wired into the suite by tests/conftest.py).

* `isolated_streaming`: a private TMPDIR per test (streaming's filelocks, spawned processes'
  temp files) and removal of the /dev/shm segments streaming created during the test.
* `tiny_corpus` (session): a 512-token BPE and a seq_len-64 dataset over ~300 KB of stdlib sources.
* `stdlib_corpus` (session): `make data`'s data/stdlib when complete, else a capped build.
* `write_synthetic_dataset`: a real packed dataset from given token-id documents.
* `run_processes`: run a function in N processes joined by a gloo process group, with no
  RANK/WORLD_SIZE/LOCAL_* environment (the data layer must not need it); tests/harness.py.
"""
from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from cplm_megatron.data.atomic_output import fingerprint
from cplm_megatron.data.manifest import DatasetError, DatasetManifest, write_manifest
from cplm_megatron.data.shards import make_manifest, write_packed_samples
from cplm_megatron.data.stdlib_corpus import (
    StdlibCorpus,
    build_stdlib_corpus,
    load_stdlib_corpus,
    stdlib_root,
    stdlib_sources,
)
from cplm_megatron.data.tokenizer import TokenizerInfo
from cplm_megatron.data.tokenizer_training import train_tokenizer_from_files

REPO_ROOT = Path(__file__).resolve().parents[1]
_STREAMING_SHM = re.compile(r"^\d{6}_")  # streaming's shared-memory names: f"{prefix:06}_{name}"
SHM_DIR = Path("/dev/shm")


def _streaming_segments() -> set[str]:
    return {p.name for p in SHM_DIR.iterdir() if _STREAMING_SHM.match(p.name)} if SHM_DIR.is_dir() else set()


def _prefixes_opened_in(tmpdir: Path) -> set[str]:
    """The shared-memory prefixes of the datasets whose processes had `tmpdir` as temp dir: streaming names its
    filelocks there after the prefix (NNNNNN_barrier_filelock, NNNNNN_cache_filelock)."""
    return {p.name[:6] for p in Path(tmpdir).glob("[0-9]" * 6 + "_*")} if Path(tmpdir).is_dir() else set()


def _mapped_by_another_process(names: set[str]) -> set[str]:
    """Those of `names` (in /dev/shm) that a live process other than this one has mapped: a live job's segments."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if maps.parent.name == str(os.getpid()):
            continue
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        mapped |= {name for name in names if f"/dev/shm/{name}" in text}
    return mapped


@contextmanager
def streaming_segments_removed(tmpdir: Path | str | None = None) -> Iterator[None]:
    """Remove the /dev/shm segments this block's own datasets left: new ones whose prefix the block's processes
    used (their TMPDIR, `tmpdir`, default the current temp dir) and that no other live process maps. Segments of
    other jobs on the machine (a training run beside the suite) are never touched, even after a prefix is reused."""
    tmpdir = Path(tmpdir or tempfile.gettempdir())
    before = _streaming_segments()
    try:
        yield
    finally:
        ours = _prefixes_opened_in(tmpdir)
        new = {name for name in _streaming_segments() - before if name[:6] in ours}
        for name in new - _mapped_by_another_process(new):
            (SHM_DIR / name).unlink(missing_ok=True)


@pytest.fixture
def isolated_streaming(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Private temp dir for this test's streaming state; its new /dev/shm segments are removed after."""
    tmp = tmp_path_factory.mktemp("streaming-tmp")
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with streaming_segments_removed(tmp):
        yield tmp


@dataclass(frozen=True)
class TinyCorpus:
    """A small real corpus: source files, tokenizer and one prepared dataset."""

    source_files: list[Path]
    tokenizer_dir: Path
    dataset_dir: Path
    seq_len: int
    tokenizer: TokenizerInfo


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> TinyCorpus:
    """Built once per session (~5 s)."""
    from cplm_megatron.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("tiny-corpus")
    files = stdlib_sources(stdlib_root(), max_bytes=300_000)
    tokenizer = train_tokenizer_from_files(files, 512, root / "tokenizer", show_progress=False)
    seq_len = 64
    prepare_dataset(files, tokenizer.output, root / "data", seq_len=seq_len, workers=1, show_progress=False,
                    shard_size_limit=1 << 16)
    return TinyCorpus(files, tokenizer.output, root / "data", seq_len, tokenizer.info)


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory: pytest.TempPathFactory) -> StdlibCorpus:
    """The corpus `make data` built (data/stdlib, used as it is), else a ~1.5 MB build (~10 s)."""
    try:
        return load_stdlib_corpus(REPO_ROOT / "data" / "stdlib")
    except (FileNotFoundError, DatasetError):
        pass
    return build_stdlib_corpus(tmp_path_factory.mktemp("stdlib-corpus"), vocab_size=1024, max_bytes=1_500_000,
                               show_progress=False)


def synthetic_tokenizer(vocab_size: int = 4096, eod_id: int = 0, name: str = "synthetic") -> TokenizerInfo:
    """A TokenizerInfo for datasets written directly from token ids (no tokenizer files)."""
    return TokenizerInfo(name=name, sha256=fingerprint({"synthetic": name, "vocab": vocab_size}),
                         vocab_size=vocab_size, eod_id=eod_id, eod_token="<|endoftext|>")


def write_synthetic_dataset(
    directory: Path,
    docs: Sequence[Sequence[int]],
    seq_len: int,
    tokenizer: TokenizerInfo | None = None,
    shard_size_limit: int = 1 << 12,
) -> DatasetManifest:
    """Pack `docs` (token ids, EOD appended) into a dataset at `directory` with the real writer."""
    tokenizer = tokenizer or synthetic_tokenizer()
    directory.mkdir(parents=True, exist_ok=True)
    packer = write_packed_samples(docs, directory, seq_len, tokenizer, shard_size_limit)
    manifest = make_manifest(packer, tokenizer, fingerprint({"dir": str(directory), "docs": len(docs)}),
                             [f"synthetic:{len(docs)}-docs"])
    write_manifest(directory, manifest)
    return manifest


def numbered_docs(num_samples: int, seq_len: int, doc_len: int, first_token: int = 1) -> list[list[int]]:
    """Documents of distinct consecutive ids (never the EOD id 0) whose packing gives exactly
    `num_samples` full samples (a stream of num_samples * seq_len + 1 tokens, EODs included)."""
    total = num_samples * seq_len + 1
    docs, produced, token = [], 0, first_token
    while produced < total:
        remaining = total - produced
        length = remaining - 1 if remaining - (doc_len + 1) < 2 else doc_len
        docs.append(list(range(token, token + length)))
        token += length
        produced += length + 1
    return docs


def load_tool(name: str) -> ModuleType:
    """Import tools/<name>.py as a module (to call its main() in-process, without interpreter startup)."""
    path = REPO_ROOT / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"cplm_tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for running the tools in a subprocess (current TMPDIR, no tokenizer thread spam)."""
    env = dict(os.environ)
    env["TMPDIR"] = tempfile.gettempdir()
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.update(extra or {})
    return env


def run_processes(fn: Callable, world_size: int, *args: object) -> list:
    """fn(rank, *args) in `world_size` processes with a gloo default group and no RANK/WORLD_SIZE/LOCAL_*
    environment (tests/harness.py)."""
    from tests.harness import run_processes as run

    return run(fn, world_size, *args)
