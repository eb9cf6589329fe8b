"""The Python sources installed on this machine, by distribution: the standard library and every site-packages
directory of the running interpreter (plus any extra roots given).

A distribution is what pip installed (its RECORD / installed-files list, found through `importlib.metadata`);
a source file under a site directory that no distribution lists belongs to a pseudo-distribution named after its
top-level entry (`unowned-<name>`: system packages without a file list). The standard library (its test suites
left out, as in the embedded stdlib corpus) is the distribution `python-stdlib`. Each file carries its path relative
to its root and the sha256 of its bytes, so everything later (order, dedup, split, sample) is the same wherever the
same package set is installed. Files that are not UTF-8 text (another encoding, NUL bytes), empty, unreadable or
above `max_file_bytes` are left out and counted; dangling links are not listed. Each distribution carries its
licence as its metadata states it (`distribution_licence`).
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import site
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from cplm_megatron.data.stdlib_corpus import stdlib_root, stdlib_sources

STDLIB = "python-stdlib"
STDLIB_LICENCE = "PSF-2.0"
NO_METADATA_LICENCE = "unknown (no distribution metadata)"
DEFAULT_MAX_FILE_BYTES = 4 * 1024 * 1024  # larger .py files are data tables, not code
_NORMALIZE = re.compile(r"[-_.]+")


def normalize_name(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): 'Typing_Extensions' -> 'typing-extensions'."""
    return _NORMALIZE.sub("-", name).lower()


def name_hash(name: str, purpose: str) -> float:
    """A stable number in [0, 1) per (purpose, name)."""
    return int.from_bytes(hashlib.sha256(f"{purpose}:{name}".encode()).digest()[:8], "big") / 2**64


@dataclass(frozen=True)
class SourceFile:
    """One installed source file: where it is, its path inside its root, size and content digest."""

    path: Path
    relpath: str
    size: int
    digest: str  # sha256 of the bytes


@dataclass
class Distribution:
    """An installed distribution's source files (sorted by relpath)."""

    name: str  # normalized
    version: str
    files: list[SourceFile] = field(default_factory=list)
    licence: str = NO_METADATA_LICENCE  # as its metadata states it (distribution_licence)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class Skipped:
    """Files left out while listing, by reason."""

    not_utf8: int = 0
    empty: int = 0
    too_large: int = 0
    unreadable: int = 0
    named: list[tuple[str, str]] = field(default_factory=list)  # (reason, path) of the undecodable and unreadable

    def to_dict(self) -> dict[str, int]:
        return {"not_utf8": self.not_utf8, "empty": self.empty, "too_large": self.too_large,
                "unreadable": self.unreadable}


def site_roots(extra: Sequence[str | Path] = ()) -> list[Path]:
    """This interpreter's site-packages directories (and the user site where it is enabled), then `extra`;
    existing, each once."""
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    candidates = [*site.getsitepackages(), *user, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                  *extra]
    roots: list[Path] = []
    for raw in candidates:
        path = Path(raw).resolve()
        if path.is_dir() and path not in roots:
            roots.append(path)
    return roots


def check_roots(roots: Sequence[str | Path]) -> list[Path]:
    """Directories given as extra roots, resolved; ValueError (one line) for one that is missing, not a directory or
    holds no .py file."""
    out = []
    for raw in roots:
        path = Path(raw).expanduser()
        if not path.is_dir():
            raise ValueError(f"--root {raw}: {'not a directory' if path.exists() else 'no such directory'}")
        if next(iter(_py_files(path)), None) is None:
            raise ValueError(f"--root {raw}: holds no .py file")
        out.append(path.resolve())
    return out


def distribution_licence(meta) -> str:
    """A distribution's licence as its core metadata states it: License-Expression (PEP 639), else a one-line
    License field, else its `License ::` classifiers, else the first line of the licence text the License field
    holds; "not stated" when none is given."""
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return expression
    lines = [line.strip() for line in (meta.get("License") or "").splitlines() if re.search(r"[A-Za-z]", line)]
    if len(lines) == 1 and len(lines[0]) <= 80 and lines[0].upper() != "UNKNOWN":
        return lines[0]
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or () if c.startswith("License ::")]
    if classifiers:
        return "; ".join(classifiers)
    if lines and lines[0].upper() != "UNKNOWN":
        return f"{lines[0][:60]} (the licence text in its metadata)"
    return "not stated"


def _owners(root: Path) -> dict[str, tuple[str, str, str]]:
    """{normalized source path: (normalized distribution name, version, licence)} from the file lists of the
    distributions in `root` (entries outside `root`, such as scripts in bin/, are never among its sources)."""
    owners: dict[str, tuple[str, str, str]] = {}
    for dist in metadata.distributions(path=[str(root)]):
        meta = dist.metadata
        if not meta["Name"]:
            continue
        owner = (normalize_name(meta["Name"]), meta["Version"] or "", distribution_licence(meta))
        for entry in dist.files or ():
            if entry.suffix == ".py":
                owners[os.path.normpath(os.path.join(root, str(entry)))] = owner
    return owners


def _py_files(root: Path) -> Iterable[Path]:
    """*.py under `root`, sorted, without __pycache__."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory) / name


def read_source(path: Path, max_file_bytes: int, skipped: Skipped) -> str | None:
    """The sha256 of a usable source file, or None (counted in `skipped`)."""
    try:
        data = path.read_bytes()
    except OSError as err:  # unreadable (permissions), or gone since it was listed
        skipped.unreadable += 1
        skipped.named.append((f"unreadable ({err.strerror or type(err).__name__})", str(path)))
        return None
    if len(data) > max_file_bytes:
        skipped.too_large += 1
        return None
    if not data.strip():
        skipped.empty += 1
        return None
    try:
        if b"\x00" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        skipped.not_utf8 += 1
        skipped.named.append((f"not UTF-8 text ({err.reason} at byte {err.start})", str(path)))
        return None
    return hashlib.sha256(data).hexdigest()


def _listed(dists: dict[str, Distribution], name: str, version: str, path: Path, relpath: str,
            licence: str = NO_METADATA_LICENCE) -> None:
    """Add a file (size from stat, digest still unknown) to its distribution (a dangling link is no source)."""
    try:
        size = path.stat().st_size
    except OSError:
        return
    dist = dists.setdefault(name, Distribution(name, version, licence=licence))
    if version and version not in dist.version.split("+"):  # the same name in two roots: both versions named
        dist.version = "+".join(v for v in (dist.version, version) if v)
    dist.files.append(SourceFile(path, relpath, size, ""))


def installed_distributions(roots: Sequence[Path] | None = None, include_stdlib: bool = True) -> list[Distribution]:
    """Every distribution's source files, listed (sizes, no contents read yet), distributions sorted by name and
    files by relpath. `roots`: site directories (default: `site_roots()`)."""
    dists: dict[str, Distribution] = {}
    if include_stdlib:
        lib = stdlib_root()
        for path in stdlib_sources(lib):
            _listed(dists, STDLIB, platform.python_version(), path, path.relative_to(lib).as_posix(), STDLIB_LICENCE)
    for root in roots if roots is not None else site_roots():
        owners = _owners(root)
        for path in _py_files(root):
            relpath = path.relative_to(root).as_posix()
            name, version, licence = owners.get(
                str(path), (f"unowned-{normalize_name(relpath.split('/')[0])}", "", NO_METADATA_LICENCE))
            _listed(dists, name, version, path, relpath, licence)
    for dist in dists.values():
        dist.files.sort(key=lambda f: f.relpath)
    return sorted(dists.values(), key=lambda d: d.name)


def read_distributions(dists: Sequence[Distribution], max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
                       ) -> tuple[list[Distribution], Skipped]:
    """The distributions with their usable files' content digests (others left out and counted); distributions
    left without a file are dropped."""
    skipped, out = Skipped(), []
    for dist in dists:
        files = []
        for f in dist.files:
            digest = read_source(f.path, max_file_bytes, skipped)
            if digest is not None:
                files.append(SourceFile(f.path, f.relpath, f.size, digest))
        if files:
            out.append(Distribution(dist.name, dist.version, files, dist.licence))
    return out, skipped


def limit_distributions(dists: Sequence[Distribution], packages: Sequence[str] | None = None,
                        max_bytes: int | None = None) -> list[Distribution]:
    """The distributions named in `packages` (all if None), then, under `max_bytes`, whole distributions in
    name-hash order while they fit (a deterministic subset); sorted by name."""
    chosen = list(dists)
    if packages is not None:
        wanted = {normalize_name(p) for p in packages}
        unknown = wanted - {d.name for d in dists}
        if unknown:
            raise ValueError(f"--packages: {sorted(unknown)} not installed here; installed: "
                             f"{', '.join(d.name for d in dists)}")
        chosen = [d for d in chosen if d.name in wanted]
    if max_bytes is not None:
        kept, total = [], 0
        for dist in sorted(chosen, key=lambda d: name_hash(d.name, "cap")):
            if total + dist.bytes <= max_bytes:
                kept.append(dist)
                total += dist.bytes
        chosen = kept
    return sorted(chosen, key=lambda d: d.name)
