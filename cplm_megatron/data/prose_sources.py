"""English prose from Debian's documentation packages, as plain-text documents grouped for a split.

The sources (`SOURCES`): the Python 3.11 documentation (its reStructuredText sources), the Linux kernel's
Documentation/ (reStructuredText and text; translations and device-tree bindings left out), the Debian
Administrator's Handbook (en-US HTML), the Debian Reference (English HTML), the GNU coding and maintainer standards
(text) and the Linux man-pages project's pages (roff). Only files the package itself installed count (`dpkg-query
-L`). Each document is extracted to UTF-8 text (`extract_text`: HTML without markup, roff without macros and font
escapes, reStructuredText and text as they are) and belongs to a group, the unit a split keeps whole: a package's
top-level section (kernel subsystem, Python doc section, man section) or the whole package. Every package's
licences come from its Debian copyright file (`package_licences`).
"""
from __future__ import annotations

import gzip
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

MIN_DOCUMENT_BYTES = 200  # shorter extractions (redirects, stubs, empty index pages) are left out


@dataclass(frozen=True)
class ProseSource:
    """One Debian package's documents: which of its installed files, how to read them, how to group them."""

    package: str
    root: str  # the directory its documents live under
    pattern: str  # regular expression on the path relative to `root`
    kind: str  # "rst" | "text" | "html" | "roff"
    group_depth: int = 1  # path components under `root` that name a group (0: the whole package is one group)
    exclude: tuple[str, ...] = ()  # relative-path prefixes left out
    apt_package: str = ""  # what `apt-get install` names, when it is not `package` (a metapackage)

    def group(self, relpath: str) -> str:
        """The group a document belongs to: `package/<first group_depth directories>` (`package/top` for files
        directly under the root)."""
        parts = relpath.split("/")[:-1][: self.group_depth]
        return f"{self.package}/{'/'.join(parts) if parts else 'top'}" if self.group_depth else self.package


SOURCES: tuple[ProseSource, ...] = (
    ProseSource("python3.11-doc", "/usr/share/doc/python3.11/html/_sources", r".*\.rst\.txt$", "rst",
                apt_package="python3-doc"),
    ProseSource("linux-doc-6.1", "/usr/share/doc/linux-doc-6.1/Documentation", r".*\.(rst|txt)(\.gz)?$", "rst",
                exclude=("translations/", "devicetree/bindings/", "ABI/"), apt_package="linux-doc"),
    ProseSource("debian-handbook", "/usr/share/doc/debian-handbook/html/en-US", r"[^/]*\.html$", "html", 0),
    ProseSource("debian-reference-en", "/usr/share/debian-reference", r"[^/]*\.en\.html$", "html", 0),
    ProseSource("gnu-standards", "/usr/share/doc/gnu-standards", r"[^/]*\.text(\.gz)?$", "text", 0),
    ProseSource("manpages", "/usr/share/man", r"man[1-8]/[^/]*\.[1-8]\w*(\.gz)?$", "roff"),
    ProseSource("manpages-dev", "/usr/share/man", r"man[1-8]/[^/]*\.[1-8]\w*(\.gz)?$", "roff"),
)


def apt_packages(sources: Sequence[ProseSource] = SOURCES) -> list[str]:
    """What to install for `sources` (`apt-get install --no-install-recommends ...`)."""
    return [s.apt_package or s.package for s in sources]


def install_missing(sources: Sequence[ProseSource]) -> list[str]:
    """apt-get install the packages of `sources` that are not installed (UserError naming the failure); what it
    installed."""
    from cplm_megatron.errors import UserError

    missing = apt_packages([s for s in sources if installed_files(s.package) is None])
    if not missing:
        return []
    print(f"[prose-corpus] apt-get install {' '.join(missing)}", flush=True)
    proc = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise UserError(f"apt-get install {' '.join(missing)} failed ({proc.returncode}: {last}); it needs root and "
                        f"a reachable Debian mirror (apt-get update first)")
    return missing


def installed_files(package: str) -> list[Path] | None:
    """The regular files a Debian package installed (None: the package is not installed)."""
    try:
        out = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None
    if out.returncode != 0:
        return None
    return sorted(p for p in map(Path, out.stdout.splitlines()) if p.is_file() and not p.is_symlink())


def package_version(package: str) -> str:
    """The installed version of a Debian package ('' when unknown)."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True,
                         check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def source_documents(source: ProseSource, files: Iterable[Path]) -> list[tuple[str, Path]]:
    """(relative path, file) of the package's files that are documents of `source`."""
    root, pattern = Path(source.root), re.compile(source.pattern)
    out = []
    for path in files:
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            continue
        if pattern.fullmatch(rel) and not rel.startswith(source.exclude):
            out.append((rel, path))
    return out


def read_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped when it ends in .gz."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


class _HTMLText(HTMLParser):
    """The visible text of an HTML page, a line break at every block element."""

    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt", "dd", "table",
              "section", "blockquote", "title"}
    HIDDEN = {"script", "style", "head", "nav"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in self.HIDDEN:
            self.hidden += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


_ROFF_ESCAPES = [(re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""), (re.compile(r"\\\(em|\\\[em\]"), "—"),
                 (re.compile(r"\\\((aq|cq)"), "'"), (re.compile(r"\\\((lq|rq|dq)"), '"'), (re.compile(r"\\[-e]"), "-"),
                 (re.compile(r"\\&|\\:|\\%|\\c"), ""), (re.compile(r"\\\(.."), ""), (re.compile(r"\\ "), " ")]
_ROFF_TEXT_MACROS = {"B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "UR", "MT"}
_ROFF_HEADINGS = {"SH", "SS", "TH"}
_ROFF_BREAKS = {"PP", "LP", "P", "sp", "br", "TP", "IP", "HP", "RS", "RE", "in", "ti"}


def _roff_escapes(text: str) -> str:
    for pattern, replacement in _ROFF_ESCAPES:
        text = pattern.sub(replacement, text)
    return text.replace("\\\\", "\\")


def _macro_args(args: str) -> str:
    return " ".join(a.strip('"') for a in re.findall(r'"[^"]*"|\S+', args))


def roff_text(source: str) -> str:
    """A man page's text: filled paragraphs (as `man` sets them), headings on their own lines, no-fill blocks
    (.nf/.EX) line by line; macros without text, comments and font escapes left out."""
    out: list[str] = []
    paragraph: list[str] = []
    fill = True

    def flush() -> None:
        if paragraph:
            out.append(" ".join(paragraph))
            paragraph.clear()

    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            name, _, args = line[1:].strip().partition(" ")
            if name in ("nf", "EX"):
                flush()
                fill = False
            elif name in ("fi", "EE"):
                fill = True
            elif name in _ROFF_HEADINGS:
                flush()
                out.extend(["", _roff_escapes(_macro_args(args))])
            elif name in _ROFF_BREAKS:
                flush()
                out.append("")
                if args.strip() and name in ("TP", "IP"):
                    paragraph.append(_roff_escapes(_macro_args(args)))
            elif name in _ROFF_TEXT_MACROS and args.strip():
                text = _roff_escapes(_macro_args(args))
                (paragraph.append(text) if fill else out.append(text))
            continue
        text = _roff_escapes(line)
        if not fill:
            out.append(text)
        elif not text.strip():
            flush()
            out.append("")
        else:
            paragraph.append(text.strip())
    flush()
    return "\n".join(out)


def extract_text(data: bytes, kind: str) -> str:
    """A document's plain text (UTF-8 with replacement of undecodable bytes; trailing spaces and runs of blank lines
    collapsed)."""
    text = data.decode("utf-8", errors="replace")
    if kind == "html":
        parser = _HTMLText()
        parser.feed(text)
        parser.close()
        text = "".join(parser.parts)
    elif kind == "roff":
        if text.lstrip().startswith(".so "):
            return ""  # a redirect to another page
        text = roff_text(text)
    elif kind not in ("rst", "text"):
        raise ValueError(f"unknown document kind {kind!r}")
    lines = [line.strip() if kind == "html" else line.rstrip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


_DEP5_LICENCE = re.compile(r"^License:[ \t]*(\S[^\n]{0,60})$", re.MULTILINE)
_KNOWN = (("Python Software Foundation", "PSF-2.0"), ("GNU Free Documentation License", "GFDL"),
          ("GNU General Public License", "GPL"), ("Creative Commons", "CC"), ("BSD", "BSD"), ("MIT", "MIT"))


def package_licences(package: str, doc_root: Path = Path("/usr/share/doc")) -> dict[str, object]:
    """The licences named in a package's Debian copyright file: DEP-5 `License:` fields, else the licences its text
    names; with the file's path (the authoritative record)."""
    path = doc_root / package / "copyright"
    if not path.is_file():
        return {"copyright_file": None, "licences": [], "format": "missing"}
    text = path.read_text(errors="replace")
    fields = sorted({m.strip() for m in _DEP5_LICENCE.findall(text)})
    if text.startswith("Format:") and fields:
        return {"copyright_file": str(path), "licences": fields, "format": "DEP-5"}
    named = [short for phrase, short in _KNOWN if phrase in text]
    return {"copyright_file": str(path), "licences": named, "format": "free text"}
