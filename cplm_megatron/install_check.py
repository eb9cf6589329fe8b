"""`pip check` for this project's environment, less what installing mosaicml-streaming without its dependencies
leaves declared but unused: `python -m cplm_megatron.install_check` (the last step of `make setup`).

mosaicml-streaming 0.13.0 is installed with `pip install --no-deps`: its metadata asks for every cloud SDK
(Azure, Google Cloud, OCI, paramiko), torchvision (which would replace a CPU torch) and transformers < 5, while
this project uses transformers 5 and streaming's local and S3 readers, whose own needs are in setup.py. pip
reports those declared requirements as missing or conflicting; this check accepts exactly those, in one line,
and fails (exit 1) on any other broken requirement.
"""
from __future__ import annotations

import re
import subprocess
import sys
from typing import List, Optional, Sequence

STREAMING = "mosaicml-streaming"
# what streaming's metadata declares and the project leaves out on purpose (see the docstring)
STREAMING_UNUSED = ("azure-identity", "azure-storage-blob", "azure-storage-file-datalake", "google-cloud-storage",
                    "oci", "paramiko", "torchvision", "transformers")
_REPORT = re.compile(r"^(?P<who>\S+) \S+ (?:requires (?P<missing>[^,\s]+)|has requirement (?P<conflict>[A-Za-z0-9_.\-]+))")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unexpected(report: str) -> List[str]:
    """The lines of `pip check`'s report other than streaming's declared-but-unused requirements."""
    out = []
    for line in report.splitlines():
        line = line.strip()
        if not line or line == "No broken requirements found." or line.startswith("WARNING: Location"):
            continue
        m = _REPORT.match(line)
        name = m and _canonical(m.group("missing") or m.group("conflict"))
        if not (m and _canonical(m.group("who")) == STREAMING and name in STREAMING_UNUSED):
            out.append(line)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run `pip check` with this interpreter: one line and exit 0 where only the accepted lines appear, else the
    other lines and exit 1."""
    del argv
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    bad = unexpected(proc.stdout + proc.stderr)
    if bad:
        print("error: pip check finds broken requirements:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    print(f"[setup] pip check: no broken requirements but {STREAMING}'s cloud SDKs, torchvision and transformers<5 "
          "(left out on purpose: cplm_megatron/install_check.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
