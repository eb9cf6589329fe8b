"""A code corpus for SmolLM2-135M-sized runs, built offline from the Python sources installed on the machine.

    corpus = build_code_corpus("data/code")            # every installed distribution (tools/build_code_corpus.py)

Sources (cplm_megatron.data.code_sources): the standard library and every site-packages distribution. Steps:

1. Split by distribution, so no package straddles train and the held-out splits: distributions in the order of a
   hash of their name fill validation up to `val_fraction` of all source bytes, then dev (the cache control's
   tuning split) up to `dev_fraction`; the rest is train. A distribution larger than `max_distribution_share` of
   a held-out split, or that would lose half its bytes to step 3's size and generator rules, stays in train.
   Where no distribution fits a held-out split (a small or lopsided package set), the split adapts: its share
   grows (x2, x4, x8; both held-out splits together at most 30%), then one distribution may supply more of it
   (50%, 100%), then one document may hold more of it (2%, 10%, 50%), last one small distribution alone is the
   split (while the held-out splits stay within 30%); split.json's `split_rules` gives each
   held-out split's rule and, where it adapted, what changed and why. Held-out files are written one
   distribution at a time in turn, so the first N validation samples span the split's packages.
2. Deduplicate by content (sha256 of the bytes): a file whose content came earlier (train first, then dev, then
   validation; each in name order) is left out. So no held-out document is a training document.
3. Clean the held-out splits: files above `max_document_share` of the split's bytes (no document dominates the
   split's loss), generated files (a generator's marker in the first lines) and near-duplicates of training files
   (>= `near_duplicate` of their distinct 16-word shingles occur in a training file: vendored copies of other
   versions) are left out of the corpus, never moved to train.
4. A byte-level BPE of `vocab_size` tokens trained on a sample of the training files (`tokenizer_sample_bytes`,
   by content hash: the same sample for the same package set wherever it is installed).
5. Packed MDS datasets (train, dev, val) written by every core; DIR/split.json: every split's distributions,
   documents, tokens, the largest document's share, what was left out and why, the held-out shingles that occur
   in train, the package list with versions and licences, and the size rules checked.

The result depends only on the package set (names, versions, file contents) and the settings.
"""
from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cplm_megatron.data.code_sources import (
    DEFAULT_MAX_FILE_BYTES,
    Distribution,
    SourceFile,
    installed_distributions,
    limit_distributions,
    name_hash,
    read_distributions,
    site_roots,
)
from cplm_megatron.data.prepare import prepare_dataset
from cplm_megatron.data.stdlib_corpus import SHINGLE_WORDS, _window_hashes, document_sizes, is_generated
from cplm_megatron.data.tokenizer_training import train_tokenizer_from_files

SPLITS = ("train", "dev", "val")
HELD_OUT = ("dev", "val")
SPLIT_RECORD = "split.json"
RECORD_VERSION = 1
NAMED_ON_CONSOLE = 10  # undecodable or unreadable sources named on the console (split.json names them all)


@dataclass(frozen=True)
class CodeCorpusSettings:
    """How the corpus is split, cleaned, tokenized and packed."""

    vocab_size: int = 49152  # SmolLM2's
    seq_len: int = 2048
    val_fraction: float = 0.04  # of all source bytes
    dev_fraction: float = 0.01
    max_distribution_share: float = 0.25  # of a held-out split's bytes, per distribution
    max_document_share: float = 0.004  # of a held-out split's bytes, per document (its tokens stay <= 1%)
    near_duplicate: float = 0.1  # a held-out file sharing this fraction of its shingles with train is left out
    tokenizer_sample_bytes: int = 48 * 1024 * 1024
    min_frequency: int = 2

    def validate(self) -> None:
        """Raise ValueError naming a bad setting."""
        for name in ("val_fraction", "dev_fraction", "max_distribution_share", "max_document_share", "near_duplicate"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must lie in (0, 1], got {value}")
        if self.val_fraction + self.dev_fraction >= 1:
            raise ValueError("val_fraction + dev_fraction must be < 1")
        if self.vocab_size < 257 or self.seq_len < 1 or self.tokenizer_sample_bytes < 1:
            raise ValueError("vocab_size must be > 256, seq_len and tokenizer_sample_bytes >= 1")


@dataclass(frozen=True)
class SizeRules:
    """What a corpus for SmolLM2-135M must hold (checked by `make data-code`)."""

    min_train_tokens: int = 50_000_000
    min_val_documents: int = 500
    min_val_tokens: int = 2_000_000
    max_val_document_share: float = 0.01
    vocab_size: int = 49152


def check_size_rules(record: dict[str, Any], rules: SizeRules = SizeRules()) -> list[str]:
    """The rules a built corpus' split.json breaks (empty: all hold)."""
    splits, failures = record["splits"], []
    if splits["train"]["tokens"] < rules.min_train_tokens:
        failures.append(f"train tokens {splits['train']['tokens']:,} < {rules.min_train_tokens:,}")
    if splits["val"]["documents"] < rules.min_val_documents:
        failures.append(f"validation documents {splits['val']['documents']:,} < {rules.min_val_documents:,}")
    if splits["val"]["tokens"] < rules.min_val_tokens:
        failures.append(f"validation tokens {splits['val']['tokens']:,} < {rules.min_val_tokens:,}")
    share = splits["val"]["largest_document_share"]
    if share is None or share > rules.max_val_document_share:
        failures.append(f"the largest validation document holds {share} of the split's tokens "
                        f"> {rules.max_val_document_share}")
    if record["tokenizer"]["vocab_size"] != rules.vocab_size:
        failures.append(f"vocabulary {record['tokenizer']['vocab_size']:,} != {rules.vocab_size:,}")
    for split in HELD_OUT:
        contamination = record["held_out_overlap"][split]
        if contamination["files_in_train"] or contamination["largest_file_fraction"] >= record["settings"]["near_duplicate"]:
            failures.append(f"{split} holds training content: {contamination}")
    return failures


def usable_bytes(dist: Distribution, cap: float) -> int:
    """The bytes of `dist` a held-out split would keep: files of at most `cap` bytes that no generator wrote."""
    return sum(f.size for f in dist.files if f.size <= cap and not is_generated(f.path))


# How a held-out split adapts when no distribution fits its asked rules (small or lopsided package sets): its share
# of the source bytes grows by these factors (the held-out splits together at most MAX_HELD_OUT), then one
# distribution may supply more of it, then one document may hold more of it, and last one of the smallest
# distributions is held out alone; the first rung that fills at least MIN_FILL of its target is taken.
GROWTH_FACTORS = (1, 2, 4, 8)
RELAXED_DISTRIBUTION_SHARES = (0.5, 1.0)
RELAXED_DOCUMENT_SHARES = (0.02, 0.1, 0.5)
MAX_HELD_OUT = 0.3
MIN_FILL = 0.5


@dataclass(frozen=True)
class SplitRule:
    """What a held-out split was drawn with: its share of all source bytes, the most one distribution and one
    document may hold of it."""

    fraction: float
    distribution_share: float
    document_share: float

    def document_cap(self, total: int) -> float:
        """The largest document (bytes) the split keeps."""
        return self.document_share * self.fraction * total


@dataclass(frozen=True)
class SplitPlan:
    """Whole distributions per split, each held-out split's rule (the asked one, or as adapted) and one line per
    adapted held-out split saying what changed and why."""

    splits: dict[str, list[Distribution]]
    rules: dict[str, SplitRule]
    adapted: dict[str, str]
    total_bytes: int

    def document_caps(self) -> dict[str, float]:
        """The largest document each held-out split keeps (bytes)."""
        return {split: rule.document_cap(self.total_bytes) for split, rule in self.rules.items()}


def _fill(order: Sequence[Distribution], taken: set[str], total: int, rule: SplitRule
          ) -> tuple[list[Distribution], int]:
    """Distributions in `order` (none of `taken`) until the rule's target of usable bytes: each at most its share
    of the target, keeping at least half of its bytes under the per-document cap."""
    target, cap = rule.fraction * total, rule.document_cap(total)
    chosen, filled = [], 0
    for dist in order:
        if filled >= target:
            break
        if dist.name in taken or dist.bytes > rule.distribution_share * target:
            continue
        usable = usable_bytes(dist, cap)
        if usable < dist.bytes / 2:
            continue
        chosen.append(dist)
        filled += usable
    return chosen, filled


def _rungs(asked: SplitRule, others: float, free: Sequence[float]) -> list[SplitRule]:
    """The rules to try for a held-out split, the asked one first, each more relaxed than the one before; last, the
    share of each of the smallest `free` distributions (sizes as shares of all bytes) held out alone."""
    relaxed = lambda values, start: [start] + [x for x in values if x > start]  # noqa: E731
    loosest = relaxed(RELAXED_DOCUMENT_SHARES, asked.document_share)[-1]
    return [SplitRule(asked.fraction * factor, share, document)
            for document in relaxed(RELAXED_DOCUMENT_SHARES, asked.document_share)
            for share in relaxed(RELAXED_DISTRIBUTION_SHARES, asked.distribution_share)
            for factor in GROWTH_FACTORS if factor == 1 or asked.fraction * factor + others <= MAX_HELD_OUT
            ] + [SplitRule(f, 1.0, loosest) for f in sorted(free)[:3] if f > asked.fraction * GROWTH_FACTORS[-1]
                 and f + others <= MAX_HELD_OUT]


def _adapted_line(split: str, asked: SplitRule, rule: SplitRule) -> str:
    text = lambda r: (f"{r.fraction:.1%} of the bytes, <= {r.distribution_share:.0%} per distribution, "  # noqa: E731
                      f"<= {r.document_share:.1%} per document")
    return f"{split}: the asked {text(asked)} fit no distribution (or filled under {MIN_FILL:.0%}); took {text(rule)}"


def _candidates(order: Sequence[Distribution], taken: set[str], total: int, asked: SplitRule, others: float
                ) -> Iterator[tuple[SplitRule, list[Distribution]]]:
    """A held-out split's choices, the asked rule's first: each rung that fills at least MIN_FILL of its target,
    then the last rung with any distribution at all, whole and then with fewer of its distributions (what is left
    may be all a later split can take)."""
    free = [d.bytes / total for d in order if d.name not in taken]
    rungs = _rungs(asked, others, free)
    for i, rule in enumerate(rungs):
        chosen, filled = _fill(order, taken, total, rule)
        last = i == len(rungs) - 1
        if chosen and (filled >= MIN_FILL * rule.fraction * total or last):
            yield rule, chosen
        if chosen and last:
            for keep in range(len(chosen) - 1, 0, -1):
                yield rule, chosen[:keep]


def _held_out(splits: Sequence[str], order: Sequence[Distribution], total: int, asked: dict[str, SplitRule],
              rules: dict[str, SplitRule], taken: set[str]) -> dict[str, tuple[SplitRule, list[Distribution]]] | None:
    """The first choice of each split in `splits` (in turn) that leaves the later splits a choice: a split that took
    every small distribution would leave the next none (None: no choice fits them all)."""
    if not splits:
        return {}
    split = splits[0]
    others = sum(r.fraction for k, r in rules.items() if k != split)
    for rule, chosen in _candidates(order, taken, total, asked[split], others):
        rest = _held_out(splits[1:], order, total, asked, {**rules, split: rule}, taken | {d.name for d in chosen})
        if rest is not None:
            return {split: (rule, chosen), **rest}
    return None


def split_distributions(dists: Sequence[Distribution], s: CodeCorpusSettings,
                        more: str = "--max-bytes, --packages") -> SplitPlan:
    """Whole distributions per split (see the module doc, step 1), a held-out split's rule relaxed rung by rung
    where the asked one fits no distribution; ValueError (one line, naming the options `more` that add sources)
    when no choice of rungs fits every held-out split."""
    total = sum(d.bytes for d in dists)
    order = sorted(dists, key=lambda d: name_hash(d.name, "split"))
    asked = {split: SplitRule(fraction, s.max_distribution_share, s.max_document_share)
             for split, fraction in (("val", s.val_fraction), ("dev", s.dev_fraction))}
    plan = _held_out(HELD_OUT[::-1], order, total, asked, dict(asked), set())  # validation first
    if plan is None:
        split, taken = _first_unfilled(order, total, asked)
        raise ValueError(f"no distribution fits the {split} split: {len(dists)} distributions, {len(taken)} "
                         f"already held out, and holding out any one of the others whole would take the held-out splits "
                         f"past {MAX_HELD_OUT:.0%} of the {total:,} source bytes; include more packages ({more})")
    taken = {d.name for _, chosen in plan.values() for d in chosen}
    out = {split: sorted(chosen, key=lambda d: d.name) for split, (_, chosen) in plan.items()}
    out["train"] = sorted((d for d in dists if d.name not in taken), key=lambda d: d.name)
    adapted = {split: _adapted_line(split, asked[split], rule) for split, (rule, _) in plan.items()
               if rule != asked[split]}
    return SplitPlan({split: out[split] for split in SPLITS}, {k: r for k, (r, _) in plan.items()}, adapted, total)


def _first_unfilled(order: Sequence[Distribution], total: int, asked: dict[str, SplitRule]) -> tuple[str, set[str]]:
    """For the refusal: the first split without a choice when each split before it takes its first, and what those
    took."""
    rules, taken = dict(asked), set()
    for split in HELD_OUT[::-1]:
        others = sum(r.fraction for k, r in rules.items() if k != split)
        first = next(_candidates(order, taken, total, asked[split], others), None)
        if first is None:
            return split, taken
        rules[split] = first[0]
        taken |= {d.name for d in first[1]}
    return HELD_OUT[0], taken


def assign_splits(dists: Sequence[Distribution], s: CodeCorpusSettings,
                  more: str = "--max-bytes, --packages") -> dict[str, list[Distribution]]:
    """The distributions of each split (`split_distributions`' plan)."""
    return split_distributions(dists, s, more).splits


def interleave_by_distribution(files: Sequence[tuple[str, SourceFile]]) -> list[tuple[str, SourceFile]]:
    """Held-out files taken one per distribution in turn (distributions by name, files by a hash of their path), so
    any prefix of a held-out split (the first N validation samples) spans its packages."""
    groups: dict[str, list[tuple[str, SourceFile]]] = {}
    for dist, f in files:
        groups.setdefault(dist, []).append((dist, f))
    queues = [sorted(g, key=lambda x: name_hash(x[1].relpath, "order")) for _, g in sorted(groups.items())]
    out = []
    for i in range(max(map(len, queues), default=0)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


@dataclass
class CleanSplits:
    """The files each split keeps (with their distribution's name) and what was left out."""

    files: dict[str, list[tuple[str, SourceFile]]]
    dropped: dict[str, dict[str, int]]
    dropped_held_out: list[dict[str, str]]
    overlap: dict[str, dict[str, Any]] = field(default_factory=dict)


def deduplicate(splits: dict[str, list[Distribution]], s: CodeCorpusSettings,
                caps: dict[str, float] | None = None) -> CleanSplits:
    """Steps 2 and the size/generated part of step 3: content duplicates (train first), oversized and generated
    held-out files; `caps`: the largest document per held-out split (a SplitPlan's; default: the settings')."""
    total = sum(d.bytes for dists in splits.values() for d in dists)
    seen: set[str] = set()
    clean = CleanSplits({}, {}, [])
    for split in SPLITS:
        kept, dropped = [], clean.dropped.setdefault(split, {})
        cap = (caps or {}).get(split, s.max_document_share * (s.val_fraction if split == "val" else s.dev_fraction)
                               * total)
        for dist in splits[split]:
            for f in dist.files:
                reason = None
                if f.digest in seen:
                    reason = "duplicate content"
                elif split != "train" and f.size > cap:
                    reason = f"above the split's document cap ({cap:,.0f} bytes)"
                elif split != "train" and is_generated(f.path):
                    reason = "generated"
                seen.add(f.digest)
                if reason is None:
                    kept.append((dist.name, f))
                    continue
                dropped[reason] = dropped.get(reason, 0) + 1
                if split != "train":
                    clean.dropped_held_out.append({"split": split, "distribution": dist.name, "file": f.relpath,
                                                   "reason": reason})
        clean.files[split] = kept
    return clean


def shingle_hashes(text: str, coefficients: Any, words: int = SHINGLE_WORDS) -> Any:
    """The distinct hashes (uint64, sorted) of every run of `words` whitespace-separated words of `text` (the whole
    text if shorter); consistent within one process."""
    import numpy as np

    tokens = text.split()
    if not tokens:
        return np.empty(0, dtype=np.uint64)
    if len(tokens) < words:
        return np.array([hash(" ".join(tokens))], dtype=np.int64).view(np.uint64)
    ids = np.fromiter(map(hash, tokens), dtype=np.int64, count=len(tokens)).view(np.uint64)
    return np.unique(_window_hashes(ids, words, coefficients))


def _text(f: SourceFile) -> str:
    return f.path.read_bytes().decode("utf-8")


def remove_near_duplicates(clean: CleanSplits, s: CodeCorpusSettings) -> CleanSplits:
    """Step 3's near-duplicates: held-out files sharing >= `near_duplicate` of their distinct shingles with the
    training files are left out; records, per held-out split, the share of its remaining shingles found in train."""
    import numpy as np

    coefficients = np.random.default_rng(0).integers(1, 2**63, size=SHINGLE_WORDS, dtype=np.uint64) * 2 + 1
    held = {(split, i): shingle_hashes(_text(f), coefficients)
            for split in HELD_OUT for i, (_, f) in enumerate(clean.files[split])}
    universe = np.unique(np.concatenate([np.empty(0, np.uint64), *held.values()]))
    found = np.zeros(universe.size, dtype=bool)
    for _, f in clean.files["train"]:
        if universe.size:
            hashes = shingle_hashes(_text(f), coefficients)
            at = np.minimum(np.searchsorted(universe, hashes), universe.size - 1)
            found[at[universe[at] == hashes]] = True
    for split in HELD_OUT:
        kept, shared_total, shingles_total, worst = [], 0, 0, 0.0
        for i, (dist, f) in enumerate(clean.files[split]):
            hashes = held[(split, i)]
            shared = int(found[np.searchsorted(universe, hashes)].sum()) if hashes.size else 0
            fraction = shared / hashes.size if hashes.size else 0.0
            if fraction >= s.near_duplicate:
                clean.dropped[split]["near-duplicate of a training file"] = \
                    clean.dropped[split].get("near-duplicate of a training file", 0) + 1
                clean.dropped_held_out.append({"split": split, "distribution": dist, "file": f.relpath,
                                               "reason": f"near-duplicate ({fraction:.0%} of its shingles in train)"})
                continue
            kept.append((dist, f))
            shared_total, shingles_total, worst = shared_total + shared, shingles_total + hashes.size, max(worst, fraction)
        clean.files[split] = kept
        clean.overlap[split] = {"shingle_words": SHINGLE_WORDS, "shingles": shingles_total, "in_train": shared_total,
                                "fraction_in_train": shared_total / shingles_total if shingles_total else 0.0,
                                "largest_file_fraction": worst}
    return clean


def tokenizer_sample(files: Sequence[SourceFile], sample_bytes: int) -> list[SourceFile]:
    """Training files in the order of a hash of their content until `sample_bytes` (at least one file)."""
    chosen, total = [], 0
    for f in sorted(files, key=lambda f: name_hash(f.digest, "tokenizer-sample")):
        if total >= sample_bytes:
            break
        chosen.append(f)
        total += f.size
    return chosen


def workers_here() -> int:
    """The cores this process may run on (taskset, cgroups' cpusets)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class CodeCorpus:
    """A built corpus: its directory and split.json."""

    root: Path
    record: dict[str, Any]

    def split_dir(self, split: str) -> Path:
        return self.root / split

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"


def build_code_corpus(output: str | Path, settings: CodeCorpusSettings = CodeCorpusSettings(),
                      roots: Sequence[Path] | None = None, packages: Sequence[str] | None = None,
                      max_bytes: int | None = None, workers: int | None = None, show_progress: bool = True,
                      max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, log=print) -> CodeCorpus:
    """Build (or confirm up to date) the corpus of the installed sources under `output` (see the module doc).
    `packages`/`max_bytes` limit the distributions (a small, deterministic corpus for tests and dry runs)."""
    settings.validate()
    output, start = Path(output).resolve(), time.perf_counter()
    roots = list(roots) if roots is not None else site_roots()
    listed = limit_distributions(installed_distributions(roots), packages, max_bytes)
    dists, skipped = read_distributions(listed, max_file_bytes)
    for reason, path in skipped.named[:NAMED_ON_CONSOLE]:
        log(f"[code-corpus] left out {path}: {reason}")
    if len(skipped.named) > NAMED_ON_CONSOLE:
        log(f"[code-corpus] ... and {len(skipped.named) - NAMED_ON_CONSOLE} more such files (split.json lists them)")
    log(f"[code-corpus] {len(dists)} distributions, {sum(d.bytes for d in dists):,} source bytes "
        f"({time.perf_counter() - start:.0f} s)")
    plan = split_distributions(dists, settings)
    for line in plan.adapted.values():
        log(f"[code-corpus] split adapted: {line}")
    splits = plan.splits
    clean = remove_near_duplicates(deduplicate(splits, settings, plan.document_caps()), settings)
    for split in HELD_OUT:
        clean.files[split] = interleave_by_distribution(clean.files[split])
        if not clean.files[split]:
            raise ValueError(f"the {split} split keeps no document after cleaning (left out: "
                             f"{clean.dropped[split]}): include more packages (--max-bytes, --packages)")
    log("[code-corpus] split and cleaned: " + ", ".join(f"{k} {len(v):,} files" for k, v in clean.files.items())
        + f" ({time.perf_counter() - start:.0f} s)")
    train_files = [f for _, f in clean.files["train"]]
    sample = tokenizer_sample(train_files, settings.tokenizer_sample_bytes)
    tokenizer = train_tokenizer_from_files([f.path for f in sample], settings.vocab_size, output / "tokenizer",
                                           min_frequency=settings.min_frequency, show_progress=show_progress)
    log(f"[code-corpus] tokenizer: {tokenizer.info.vocab_size:,} tokens from {len(sample):,} files "
        f"({time.perf_counter() - start:.0f} s)")
    workers = workers or workers_here()
    manifests = {split: prepare_dataset([f.path for _, f in clean.files[split]], tokenizer.output, output / split,
                                        seq_len=settings.seq_len, workers=workers, show_progress=show_progress).manifest
                 for split in SPLITS}
    record = split_record(output, settings, roots, splits, clean, skipped, manifests, tokenizer.info, sample)
    record["split_rules"] = {split: {**asdict(rule), "document_cap_bytes": round(rule.document_cap(plan.total_bytes)),
                                     "adapted": plan.adapted.get(split)} for split, rule in plan.rules.items()}
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["workers"] = workers
    _write_json(output / SPLIT_RECORD, record)
    return CodeCorpus(output, record)


def split_record(output: Path, s: CodeCorpusSettings, roots: Sequence[Path], splits: dict[str, list[Distribution]],
                 clean: CleanSplits, skipped: Any, manifests: dict[str, Any], tokenizer: Any,
                 sample: Sequence[SourceFile]) -> dict[str, Any]:
    """DIR/split.json's content (see the module doc, step 5)."""
    counts = {}
    for split in SPLITS:
        files = [f for _, f in clean.files[split]]
        m = manifests[split]
        total = sum(f.size for f in files)
        counts[split] = {"distributions": len(splits[split]), "documents": m.documents, "tokens": m.tokens,
                         "samples": m.samples, "bytes": total,
                         "largest_document_bytes_share": max(f.size for f in files) / total if total else None}
        if split in HELD_OUT:
            sizes = document_sizes(output / "tokenizer", [f.path for f in files])
            counts[split].update(largest_document_share=sizes["largest_document_share"],
                                 largest_document_tokens=sizes["largest_document_tokens"])
    held_digests = {split: {f.digest for _, f in clean.files[split]} for split in HELD_OUT}
    train_digests = {f.digest for _, f in clean.files["train"]}
    for split in HELD_OUT:
        clean.overlap[split]["files_in_train"] = len(held_digests[split] & train_digests)
    return {
        "version": RECORD_VERSION, "python": platform.python_version(), "roots": [str(r) for r in roots],
        "settings": asdict(s), "splits": counts,
        "tokenizer": {"vocab_size": tokenizer.vocab_size, "sha256": tokenizer.sha256, "sample_files": len(sample),
                      "sample_bytes": sum(f.size for f in sample)},
        "distributions": [{"name": d.name, "version": d.version, "licence": d.licence, "split": split,
                           "files": len(d.files), "bytes": d.bytes} for split in SPLITS for d in splits[split]],
        "left_out_while_listing": skipped.to_dict(),
        "left_out_while_listing_files": [{"file": path, "reason": reason} for reason, path in skipped.named],
        "left_out": clean.dropped,
        "left_out_held_out_files": clean.dropped_held_out, "held_out_overlap": clean.overlap,
        "size_rules": {"rules": asdict(SizeRules())},
        "note": ("tokens: each document's tokens plus one EOD (the manifests' count); largest_document_share: the "
                 "largest document's share of its split's tokens (held-out splits; train: by bytes); "
                 "held_out_overlap: files_in_train = held-out files whose exact content is a training file's, "
                 "fraction_in_train = the share of the held-out splits' distinct 16-word shingles that occur in some "
                 "training file (shared boilerplate: licence headers, common idioms)"),
    }


def _write_json(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def load_code_corpus(output: str | Path) -> CodeCorpus:
    """A built corpus as it is; FileNotFoundError naming the build command if it is incomplete."""
    output = Path(output).resolve()
    record_path = output / SPLIT_RECORD
    if not record_path.is_file() or not all((output / s / "manifest.json").is_file() for s in SPLITS):
        raise FileNotFoundError(f"no complete code corpus at {output}; build it with `make data-code` "
                                f"(tools/build_code_corpus.py --output {output})")
    return CodeCorpus(output, json.loads(record_path.read_text()))
