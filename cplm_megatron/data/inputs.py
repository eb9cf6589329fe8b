"""Corpus inputs at cluster scale: paths, directories, glob patterns and file lists, listed lazily; the
deterministic split of the files into parts; a bounded, spread-out sample of files for tokenizer training.

An input is one of

* a file (kept as given) or a directory (searched recursively for supported files);
* a glob pattern (``corpus/**/*.jsonl.zst``; any of ``* ? [``), matched with ``**`` spanning directories;
* ``@LIST``: a text file naming one input per line (files, directories or patterns; blank lines and
  ``#`` comments skipped; relative entries are relative to the list's directory).

`iter_input_files` yields the files one at a time and walks directories one directory at a time (each
directory's entries sorted by name, recursing in place), so it never holds the tree in memory; its order
equals `documents.expand_inputs`'s (sorted by path components). A file named twice is yielded once when
`dedupe` (the default, which remembers every path) -- the part listing dedupes only its own share instead.

Parts: file ``f`` belongs to part ``part_of(f, N)`` (1-based), from a sha256 of its resolved path, so the
assignment of a file never depends on which other files exist or on the listing order. A part's files are
sorted by path, so the documents of part I of N come in the same order however the inputs were listed.
"""
from __future__ import annotations

import hashlib
import heapq
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from cplm_megatron.data.documents import InputError, _kind_of, supported_suffixes

PathLike = str | Path
_MAGIC = re.compile(r"[*?[]")
_PART = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_part(text: str) -> tuple[int, int]:
    """'I/N' (1-based) -> (I, N); InputError for anything else."""
    match = _PART.match(str(text))
    if not match:
        raise InputError(f"--part {text!r} is not I/N (e.g. --part 2/8: the second of 8 parts, 1-based)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise InputError(f"--part {text}: need 1 <= I <= N (parts are numbered 1..N), got I={index}, N={count}")
    return index, count


def part_of(path: PathLike, count: int) -> int:
    """The 1-based part (of `count`) that the file at `path` (resolved) belongs to."""
    digest = hashlib.sha256(str(Path(path).resolve()).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def part_dir_name(index: int, count: int) -> str:
    """The sub-directory of --output holding part `index` of `count`."""
    return f"part-{index:05d}-of-{count:05d}"


def _walk_sorted(directory: Path) -> Iterator[Path]:
    """Supported files under `directory`, depth first, each directory's entries sorted by name."""
    try:
        with os.scandir(directory) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
    except OSError as e:
        raise InputError(f"cannot list input directory {directory}: {e.strerror}") from e
    for name, is_dir in entries:
        path = directory / name
        if is_dir:
            yield from _walk_sorted(path)
        elif _kind_of(path) and path.is_file():
            yield path


def _glob_files(pattern: str) -> Iterator[Path]:
    """Supported files matching `pattern`, in path-component order, without listing the tree first.

    The pattern's leading components without wildcards are a fixed root; the tree under it is walked
    lazily and each path matched against the whole pattern (``**`` matches across directories)."""
    absolute = os.path.abspath(os.path.expanduser(pattern))
    parts = Path(absolute).parts
    first_magic = next(i for i, part in enumerate(parts) if _MAGIC.search(part))
    root = Path(*parts[:first_magic])
    regex = _translate(absolute)
    if not root.is_dir():
        return
    for path in _walk_sorted(root):
        if regex.match(str(path)):
            yield path


def _translate(pattern: str) -> re.Pattern:
    """glob.translate for Python < 3.13: '**' spans directories, '*' and '?' stay within one, no hidden names."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append(r"(?:[^/.][^/]*/)*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(r"(?:[^/.][^/]*/?)*")
            i += 2
            continue
        if c == "*":
            prev = pattern[i - 1] if i else "/"
            out.append(r"[^/.][^/]*" if prev == "/" else r"[^/]*")
        elif c == "?":
            out.append(r"[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _list_entries(list_file: Path) -> Iterator[str]:
    """The inputs a @LIST file names, read line by line."""
    try:
        handle = open(list_file, encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read input list {list_file}: {e.strerror}") from e
    with handle:
        for line in handle:
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            yield entry if os.path.isabs(os.path.expanduser(entry)) else str(list_file.parent / entry)


def _files_of(raw: str, from_list: Path | None = None) -> Iterator[Path]:
    where = f" (listed in {from_list})" if from_list else ""
    if raw.startswith("@") and from_list is None:
        list_file = Path(raw[1:]).expanduser().resolve()
        for entry in _list_entries(list_file):
            yield from _files_of(entry, from_list=list_file)
        return
    path = Path(raw).expanduser()
    if path.is_dir():
        found = False
        for file in _walk_sorted(path.resolve()):
            found = True
            yield file
        if not found:
            raise InputError(f"input directory {path.resolve()} holds no supported files (looked for "
                             f"{', '.join(supported_suffixes())}){where}")
    elif path.is_file():
        if _kind_of(path) is None:
            raise InputError(f"unsupported input file {path.resolve()}{where}: supported suffixes are "
                             f"{', '.join(supported_suffixes())}")
        yield path.resolve()
    elif _MAGIC.search(raw):
        found = False
        for file in _glob_files(raw):
            found = True
            yield file.resolve()
        if not found:
            raise InputError(f"input pattern {raw!r}{where} matches no supported files (looked for "
                             f"{', '.join(supported_suffixes())})")
    else:
        raise InputError(f"input path does not exist: {raw}{where}")


def iter_input_files(inputs: Sequence[PathLike], dedupe: bool = True) -> Iterator[Path]:
    """The files named by `inputs` (see the module doc), lazily, in a deterministic order."""
    if not inputs:
        raise InputError("no input paths given; pass files, directories, glob patterns or @LIST files")
    seen: set[Path] = set()
    for raw in inputs:
        for file in _files_of(str(raw)):
            if dedupe:
                if file in seen:
                    continue
                seen.add(file)
            yield file


def _path_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8", "surrogateescape")).digest()[:8], "big")


def list_part(inputs: Sequence[PathLike], index: int, count: int) -> tuple[list[Path], str]:
    """The files of part `index` of `count` (sorted by path; only this part's share is ever held), and a digest
    of the whole listing (file count and a sum of path hashes: independent of the order). Every part of one
    dataset must see the same listing: the merge compares the digests, which catches inputs that changed between
    the parts' runs and nodes that see the files under other paths."""
    mine: set[Path] = set()
    total, listed = 0, 0
    for file in iter_input_files(inputs, dedupe=False):
        total = (total + _path_key(str(file))) % (1 << 64)
        listed += 1
        if part_of(file, count) == index:
            mine.add(file)
    return sorted(mine), f"{listed}:{total:016x}"


def part_files(inputs: Sequence[PathLike], index: int, count: int) -> list[Path]:
    """The files of part `index` of `count` (see `list_part`)."""
    return list_part(inputs, index, count)[0]


def sample_files(inputs: Sequence[PathLike], max_files: int) -> tuple[list[Path], str]:
    """A spread-out, deterministic sample: the `max_files` files of smallest path hash, in hash order (a
    bottom-k sample of the listing, held in a heap of `max_files`); plus a digest of the set of files listed
    (independent of the listing order), so a changed file set is noticed without keeping it."""
    heap: list[tuple[int, str]] = []  # max-heap by negated hash
    combined, listed = 0, 0
    seen_small: set[str] = set()
    for file in iter_input_files(inputs, dedupe=False):
        name = str(file)
        key = int.from_bytes(hashlib.sha256(name.encode("utf-8", "surrogateescape")).digest()[:8], "big")
        if name in seen_small:
            continue
        combined = (combined + key) % (1 << 64)  # a file listed twice counts once only while it is in the sample
        listed += 1
        if len(heap) < max_files:
            heapq.heappush(heap, (-key, name))
            seen_small.add(name)
        elif -heap[0][0] > key:
            _, dropped = heapq.heapreplace(heap, (-key, name))
            seen_small.discard(dropped)
            seen_small.add(name)
    chosen = sorted(heap, key=lambda item: (-item[0], item[1]))
    return [Path(name) for _, name in chosen], f"{listed}:{combined:016x}"
