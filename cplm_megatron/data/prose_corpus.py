"""An English prose corpus built offline from Debian's documentation packages (data/prose_sources.py).

    corpus = build_prose_corpus("data/prose_v4096", ProseCorpusSettings())   # tools/build_prose_corpus.py

Steps: every document of every installed source package is extracted to text under DIR/text/<group>/ (a group: a
package's top-level section, or the whole package); the groups are split, cleaned and tokenized by the code corpus's
rules (data/code_corpus.py: whole groups per split in the order of a hash of their names, content duplicates and
held-out near-duplicates of training documents left out, oversized held-out documents left out, a byte-level BPE on
a sample of train, packed MDS datasets DIR/train, DIR/dev, DIR/val); documents that are near-duplicates of a code
corpus's sources (`code_corpus`: >= `near_duplicate` of their 16-word shingles in its files) are left out of every
split first, so the two domains share no text. DIR/split.json records each split's groups, documents and tokens, each
package's version and licences, what was left out and why, and the overlap with the code corpus.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cplm_megatron.data.code_corpus import (
    SPLITS,
    CodeCorpusSettings,
    assign_splits,
    deduplicate,
    remove_near_duplicates,
    shingle_hashes,
    tokenizer_sample,
    workers_here,
)
from cplm_megatron.data.code_sources import Distribution, SourceFile, installed_distributions, site_roots
from cplm_megatron.data.prepare import prepare_dataset
from cplm_megatron.data.prose_sources import (
    MIN_DOCUMENT_BYTES,
    SOURCES,
    ProseSource,
    apt_packages,
    extract_text,
    installed_files,
    package_licences,
    package_version,
    read_bytes,
    source_documents,
)
from cplm_megatron.data.stdlib_corpus import SHINGLE_WORDS
from cplm_megatron.data.tokenizer_training import train_tokenizer_from_files
from cplm_megatron.errors import UserError

SPLIT_RECORD = "split.json"
RECORD_VERSION = 1


@dataclass(frozen=True)
class ProseCorpusSettings:
    """The split, cleaning and tokenization settings (the code corpus's, sized for a few groups per package)."""

    split: CodeCorpusSettings = CodeCorpusSettings(vocab_size=4096, seq_len=256, val_fraction=0.05,
                                                   dev_fraction=0.02, max_distribution_share=1.0,
                                                   max_document_share=0.01, tokenizer_sample_bytes=48 * 2**20)
    packages: tuple[str, ...] = tuple(s.package for s in SOURCES)


class MissingSources(UserError):
    """A source package is not installed."""


def extract_documents(output: Path, sources: Sequence[ProseSource], log=print) -> tuple[list[Distribution], dict]:
    """Every source's documents as text files under `output`/text, one Distribution per group; and per package its
    version, licences and counts."""
    missing = [s.package for s in sources if installed_files(s.package) is None]
    if missing:
        names = " ".join(apt_packages([s for s in sources if s.package in missing]))
        raise MissingSources(f"not installed: {', '.join(missing)}; install them with `apt-get install -y "
                             f"--no-install-recommends {names}`, or pass --install (make data-emergence does)")
    groups: dict[str, Distribution] = {}
    packages: dict[str, Any] = {}
    for source in sources:
        version, kept, short = package_version(source.package), 0, 0
        for rel, path in source_documents(source, installed_files(source.package) or []):
            text = extract_text(read_bytes(path), source.kind)
            if len(text.encode()) < MIN_DOCUMENT_BYTES:
                short += 1
                continue
            group = source.group(rel)
            target = output / "text" / group / (rel.removesuffix(".gz") + ".txt")
            data = text.encode()
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.is_file() or target.read_bytes() != data:
                target.write_bytes(data)
            dist = groups.setdefault(group, Distribution(group, version))
            dist.files.append(SourceFile(target, f"{group}/{rel}", len(data), hashlib.sha256(data).hexdigest()))
            kept += 1
        packages[source.package] = {"version": version, "documents": kept, "left_out_short": short,
                                    **package_licences(source.package)}
        log(f"[prose-corpus] {source.package} {version}: {kept:,} documents ({short} shorter than "
            f"{MIN_DOCUMENT_BYTES} bytes left out)")
    return [groups[g] for g in sorted(groups)], packages


def drop_code_overlap(dists: list[Distribution], code_files: Sequence[Path], near_duplicate: float
                      ) -> tuple[list[Distribution], dict[str, Any]]:
    """`dists` without the documents that are near-duplicates of the code files (or exact copies); the counts."""
    import numpy as np

    coefficients = np.random.default_rng(0).integers(1, 2**63, size=SHINGLE_WORDS, dtype=np.uint64) * 2 + 1
    docs = [(d, f, shingle_hashes(f.path.read_text(errors="replace"), coefficients)) for d in dists for f in d.files]
    universe = np.unique(np.concatenate([np.empty(0, np.uint64), *(h for _, _, h in docs)]))
    found = np.zeros(universe.size, dtype=bool)
    for path in code_files:
        hashes = shingle_hashes(path.read_text(errors="replace"), coefficients)
        if universe.size and hashes.size:
            at = np.minimum(np.searchsorted(universe, hashes), universe.size - 1)
            found[at[universe[at] == hashes]] = True
    dropped, shared_total, total = [], 0, 0
    for _, f, hashes in docs:
        shared = int(found[np.searchsorted(universe, hashes)].sum()) if hashes.size else 0
        total, shared_total = total + hashes.size, shared_total + shared
        if hashes.size and shared / hashes.size >= near_duplicate:
            dropped.append({"file": f.relpath, "fraction_in_code": round(shared / hashes.size, 4)})
    gone = {d["file"] for d in dropped}
    kept = [replace(d, files=[f for f in d.files if f.relpath not in gone]) for d in dists]
    return [d for d in kept if d.files], {
        "code_files": len(code_files), "near_duplicate": near_duplicate, "documents_left_out": dropped,
        "shingles": total, "shingles_in_code": shared_total,
        "fraction_in_code": shared_total / total if total else 0.0}


def code_corpus_files(code_corpus: Path) -> list[Path]:
    """The source files of a built code corpus (its split.json's distributions, as installed here)."""
    record = json.loads((Path(code_corpus) / "split.json").read_text())
    wanted = {d["name"] for d in record["distributions"]}
    roots = [Path(r) for r in record.get("roots", [])] or site_roots()
    return [f.path for d in installed_distributions(roots) if d.name in wanted for f in d.files]


@dataclass
class ProseCorpus:
    """A built corpus: its directory and split.json."""

    root: Path
    record: dict[str, Any]


def build_prose_corpus(output: str | Path, settings: ProseCorpusSettings = ProseCorpusSettings(),
                       code_corpus: str | Path | None = None, workers: int | None = None, show_progress: bool = True,
                       log=print) -> ProseCorpus:
    """Build the corpus under `output` (see the module doc); `code_corpus`: a built code corpus to keep apart from."""
    s = settings.split
    s.validate()
    output, start = Path(output).resolve(), time.perf_counter()
    sources = [src for src in SOURCES if src.package in settings.packages]
    unknown = sorted(set(settings.packages) - {src.package for src in sources})
    known = ", ".join(src.package for src in SOURCES)
    if unknown:
        raise UserError(f"unknown prose source(s) {unknown}; known: {known}")
    if not sources:
        raise UserError(f"--packages names no source; known: {known}")
    if code_corpus is not None and not (Path(code_corpus) / "split.json").is_file():  # before minutes of extraction
        raise UserError(f"--code-corpus {code_corpus}: no split.json there; build the code corpus first "
                        f"(tools/build_code_corpus.py) or leave the option out")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    dists, packages = extract_documents(output, sources, log)
    code_overlap = None
    if code_corpus is not None:
        dists, code_overlap = drop_code_overlap(dists, code_corpus_files(Path(code_corpus)), s.near_duplicate)
        log(f"[prose-corpus] {len(code_overlap['documents_left_out'])} documents left out as near-duplicates of "
            f"the code corpus ({time.perf_counter() - start:.0f} s)")
    try:
        splits = assign_splits(dists, s, more="--packages")
    except ValueError as err:
        raise UserError(f"the prose groups cannot be split: {err}") from None
    clean = remove_near_duplicates(deduplicate(splits, s), s)
    log("[prose-corpus] split and cleaned: " + ", ".join(f"{k} {len(v):,} documents" for k, v in clean.files.items())
        + f" ({time.perf_counter() - start:.0f} s)")
    sample = tokenizer_sample([f for _, f in clean.files["train"]], s.tokenizer_sample_bytes)
    tokenizer = train_tokenizer_from_files([f.path for f in sample], s.vocab_size, output / "tokenizer",
                                           min_frequency=s.min_frequency, show_progress=show_progress)
    workers = workers or workers_here()
    manifests = {split: prepare_dataset([f.path for _, f in clean.files[split]], tokenizer.output, output / split,
                                        seq_len=s.seq_len, workers=workers, show_progress=show_progress).manifest
                 for split in SPLITS}
    record = {
        "version": RECORD_VERSION, "settings": asdict(settings), "packages": packages,
        "splits": {split: {"groups": sorted(d.name for d in splits[split]), "documents": manifests[split].documents,
                           "tokens": manifests[split].tokens, "samples": manifests[split].samples,
                           "bytes": sum(f.size for _, f in clean.files[split])} for split in SPLITS},
        "tokenizer": {"vocab_size": tokenizer.info.vocab_size, "sha256": tokenizer.info.sha256,
                      "sample_documents": len(sample)},
        "left_out": clean.dropped, "left_out_held_out_files": clean.dropped_held_out,
        "held_out_overlap": clean.overlap, "code_corpus": str(code_corpus) if code_corpus else None,
        "code_overlap": code_overlap, "seconds": round(time.perf_counter() - start, 1),
        "note": ("licences: each package's Debian copyright file (DEP-5 License fields, else the licences its text "
                 "names); code_overlap: documents left out of every split because >= near_duplicate of their "
                 "16-word shingles occur in the code corpus's source files"),
    }
    tmp = output / (SPLIT_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(output / SPLIT_RECORD)
    log(f"[prose-corpus] {output}: " + ", ".join(f"{k} {v['tokens']:,} tokens" for k, v in record["splits"].items())
        + f" ({record['seconds']:.0f} s)")
    return ProseCorpus(output, record)
