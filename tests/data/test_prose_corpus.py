"""The prose corpus (data/prose_sources.py, data/prose_corpus.py, tools/build_prose_corpus.py): text extraction,
groups, licences, and a real build from one Debian documentation package (installed through apt if missing, as
`make data-emergence` does)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cplm_megatron.data.prose_sources import (
    SOURCES,
    ProseSource,
    extract_text,
    package_licences,
    source_documents,
)

REPO = Path(__file__).resolve().parents[2]


def test_html_keeps_the_visible_text_one_block_per_line():
    page = (b"<html><head><title>T</title><style>p {color: red}</style></head><body><nav>menu</nav>"
            b"<h1>Chapter&nbsp;1</h1><p>First <b>bold</b> words.</p><script>var x = 1;</script>"
            b"<ul><li>one</li><li>two &amp; three</li></ul></body></html>")
    assert extract_text(page, "html") == "Chapter\xa01\n\nFirst bold words.\n\none\n\ntwo & three\n"


def test_roff_fills_paragraphs_and_drops_macros_and_escapes():
    page = "\n".join([
        '.\\" a comment', ".TH ATAN2 3 2023-02-05", ".SH NAME", "atan2 \\- arc tangent", ".SH DESCRIPTION",
        "These functions", "calculate the", ".I value", "of", ".BR y / x .", ".PP", "A \\fBbold\\fP word.",
        ".nf", "int  x;", "int  y;", ".fi", "done",
    ]).encode()
    assert extract_text(page, "roff") == ("ATAN2 3 2023-02-05\n\nNAME\natan2 - arc tangent\n\nDESCRIPTION\n"
                                          "These functions calculate the value of y / x .\n\nA bold word.\nint  x;\n"
                                          "int  y;\ndone\n")
    assert extract_text(b".so man3/other.3\n", "roff") == ""


def test_rst_and_text_are_kept_with_their_indentation():
    assert extract_text(b"Title\n=====\n\n\n\n  code block   \nend", "rst") == "Title\n=====\n\n  code block\nend\n"
    with pytest.raises(ValueError, match="unknown document kind"):
        extract_text(b"x", "pdf")


def test_groups_and_documents_follow_the_source_rules(tmp_path):
    source = ProseSource("pkg", str(tmp_path), r".*\.rst(\.gz)?$", "rst", exclude=("translations/",))
    files = [tmp_path / p for p in ("a.rst", "net/b.rst.gz", "net/deep/c.rst", "translations/d.rst", "e.html")]
    assert [rel for rel, _ in source_documents(source, files + [Path("/elsewhere/f.rst")])] == [
        "a.rst", "net/b.rst.gz", "net/deep/c.rst"]
    assert [source.group(r) for r in ("a.rst", "net/b.rst.gz", "net/deep/c.rst")] == ["pkg/top", "pkg/net", "pkg/net"]
    assert ProseSource("whole", "/x", ".*", "text", group_depth=0).group("a/b/c.txt") == "whole"


def test_licences_are_read_from_the_copyright_file(tmp_path):
    (tmp_path / "dep5").mkdir()
    (tmp_path / "dep5" / "copyright").write_text(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nLicense: GPL-2+\n"
        " This program is free software\n\nFiles: doc/*\nLicense: CC-BY-SA-3.0\n")
    (tmp_path / "free").mkdir()
    (tmp_path / "free" / "copyright").write_text("Copyright the authors.\nUnder the GNU Free Documentation License.\n")
    assert package_licences("dep5", tmp_path)["licences"] == ["CC-BY-SA-3.0", "GPL-2+"]
    assert package_licences("free", tmp_path) == {"copyright_file": str(tmp_path / "free" / "copyright"),
                                                  "licences": ["GFDL"], "format": "free text"}
    assert package_licences("absent", tmp_path)["format"] == "missing"


def test_a_build_from_one_package_records_splits_licences_and_what_was_left_out(tmp_path):
    """--install: the package through apt-get when missing (root and a Debian mirror, as CI has)."""
    out = tmp_path / "prose"
    proc = subprocess.run([sys.executable, str(REPO / "tools/build_prose_corpus.py"), "--install", "--output", str(out),
                           "--packages", "manpages", "--vocab-size", "512", "--seq-len", "64", "--workers", "1",
                           "--quiet"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((out / "split.json").read_text())
    package = record["packages"]["manpages"]
    assert package["format"] == "DEP-5" and "GPL-2+" in package["licences"] and package["version"]
    groups = {split: set(v["groups"]) for split, v in record["splits"].items()}
    assert all(groups.values()) and not (groups["train"] & (groups["dev"] | groups["val"]))
    assert all(v["tokens"] > 0 for v in record["splits"].values())
    for split in ("train", "dev", "val"):
        assert json.loads((out / split / "manifest.json").read_text())["documents"] == record["splits"][split]["documents"]
    assert "[prose-corpus] manpages" in proc.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    tool = [sys.executable, str(REPO / "tools/build_prose_corpus.py"), "--output", str(tmp_path / "p")]
    proc = subprocess.run(tool + ["--packages", "no-such-doc"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: unknown prose source(s) ['no-such-doc']; known: {', '.join(s.package for s in SOURCES)}"]
    proc = subprocess.run(tool + ["--packages", "manpages", "--code-corpus", str(tmp_path)], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "no split.json there" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "p").exists()  # refused before the documents were extracted (minutes for all sources)
    for flags, line in ((["--packages", ","], f"error: --packages names no source; known: "
                                               f"{', '.join(s.package for s in SOURCES)}"),
                        (["--packages", "manpages", "--workers", "0"], "error: --workers must be >= 1, got 0")):
        proc = subprocess.run(tool + flags, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [line], proc.stderr
    assert not (tmp_path / "p").exists()


def test_too_few_sources_to_split_name_this_tools_option(tmp_path):
    """One package too small to hold out a validation group: the refusal named --max-bytes, an option of the code
    corpus builder only."""
    proc = subprocess.run([sys.executable, str(REPO / "tools/build_prose_corpus.py"), "--install", "--output",
                           str(tmp_path / "p"), "--packages", "gnu-standards", "--quiet"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: the prose groups cannot be split: no distribution fits the val split")
    assert proc.stderr.rstrip().endswith("include more packages (--packages)"), proc.stderr
