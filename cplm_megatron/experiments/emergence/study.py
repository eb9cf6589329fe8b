"""The emergence study in one call: the corpora (built when missing), the pilot or the grid, summary.json and the
report.

    outcome = run_emergence(Path("results/emergence_cpu"), EmergenceSettings(), Path("data"))
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cplm_megatron.errors import UserError
from cplm_megatron.experiments.emergence.plan import (
    DOMAINS,
    EmergenceSettings,
    PilotSettings,
    corpus_dirs,
    emergence_runs,
    pilot_runs,
)
from cplm_megatron.experiments.emergence.report import write_report
from cplm_megatron.experiments.emergence.summary import THRESHOLD_RULE, pilot_table, summarize_emergence
from cplm_megatron.experiments.launch.launcher import JobResult, Launcher
from cplm_megatron.experiments.records import load_run, write_study_summary_json
from cplm_megatron.experiments.study.decision import DECISION_RULE


@dataclass
class EmergenceOutcome:
    """Where the study's outputs are and what they say."""

    report: Path
    summary_json: Path
    summary: dict[str, Any]


def corpus_built(path: Path) -> bool:
    """Whether a corpus directory holds its three splits."""
    return all((path / split / "manifest.json").is_file() for split in ("train", "dev", "val"))


def summarized(settings: EmergenceSettings, data_root: Path) -> EmergenceSettings:
    """The grid the summary covers: the invoked domains, then every other domain whose corpus is built (a run of one
    domain keeps the other's finished runs in summary.json and the report)."""
    built = tuple(d for d, path in corpus_dirs(tuple(DOMAINS), data_root).items() if corpus_built(path))
    return replace(settings, domains=tuple(dict.fromkeys(settings.domains + built)))


def ensure_corpora(domains: tuple[str, ...], data_root: Path, small: bool = False,
                   log: Callable[[str], None] = print) -> dict[str, Path]:
    """Each domain's corpus under `data_root`, built when missing (`small`: a few packages, for the smoke test)."""
    from cplm_megatron.data.code_corpus import CodeCorpusSettings, build_code_corpus
    from cplm_megatron.data.prose_corpus import ProseCorpusSettings, build_prose_corpus

    dirs = corpus_dirs(domains, data_root)
    code = corpus_dirs(("code",), data_root)["code"]
    for domain, path in dirs.items():
        if corpus_built(path):
            continue
        log(f"[emergence] building the {domain} corpus in {path} ({DOMAINS[domain].build})")
        if domain == "code":
            build_code_corpus(path, CodeCorpusSettings(vocab_size=4096, seq_len=256, dev_fraction=0.05,
                                                       max_distribution_share=1.0),
                              max_bytes=3_000_000 if small else 60_000_000, show_progress=False, log=log)
        else:
            settings = ProseCorpusSettings(packages=("manpages",)) if small else ProseCorpusSettings()
            build_prose_corpus(path, settings, code if code.is_dir() else None, show_progress=False, log=log)
    return dirs


def planned_runs(settings: EmergenceSettings, pilot: PilotSettings, corpora: dict[str, Path]
                 ) -> tuple[list, list]:
    """The grid's runs and the pilot's (its variants whose domain has a corpus in `corpora`)."""
    variants = PilotSettings(tuple(v for v in pilot.variants if v[0] in corpora), pilot.probe_interval)
    return emergence_runs(settings, corpora), pilot_runs(variants, corpora, settings)


def run_emergence(output: Path, settings: EmergenceSettings, data_root: Path, pilot: PilotSettings | None = None,
                  jobs: int = 1, command: str = "", on_done: Callable[[JobResult], None] | None = None,
                  log: Callable[[str], None] = print, summarize_only: bool = False, small_corpora: bool = False
                  ) -> EmergenceOutcome:
    """Train and evaluate the pilot's runs (with `pilot`) or the grid's (finished runs are reused), then summarize
    what finished and write OUTPUT/summary.json, OUTPUT/report.md and the figure."""
    output, start = Path(output).resolve(), time.perf_counter()
    if summarize_only and not (output / "runs").is_dir():  # was '[Errno 2] ... summary.json.tmp', after the corpora
        raise UserError(f"--summarize-only: nothing has run under {output} (no runs/ there); check --output")
    domains = tuple(dict.fromkeys(settings.domains + tuple(d for d, _, _ in (pilot.variants if pilot else ()))))
    corpora = ensure_corpora(domains, data_root, small_corpora, log)
    known = pilot or PilotSettings()  # without --pilot: the pilot's runs that finished are reported with the grid
    grid, pilots = planned_runs(settings, known, corpora)
    launcher = Launcher(output, Path(data_root).resolve())
    if not summarize_only:
        todo = pilots if pilot is not None else grid
        log(f"[emergence] {len(todo)} runs ({'the pilot' if pilot else 'the grid'}), {jobs} at a time")
        launcher.run_all(todo, jobs=jobs, on_done=on_done)
    settings = summarized(settings, data_root)
    grid, pilots = planned_runs(settings, known, {**corpus_dirs(settings.domains, data_root), **corpora})
    finished = [spec for spec in grid if launcher.is_finished(spec)]
    pilot_done = [spec for spec in pilots if launcher.is_finished(spec)]
    log(f"[emergence] finished: {len(finished)} of {len(grid)} grid runs, {len(pilot_done)} of {len(pilots)} pilot "
        f"runs")
    pilot_rows = pilot_table([load_run(spec, output) for spec in pilot_done], settings.copy_threshold)
    if finished:
        summary = summarize_emergence([load_run(spec, output) for spec in finished], settings.planned(),
                                      settings.copy_threshold)
    else:
        summary = {"scales": {}, "domains": {}, "emergence": {}, "rule": DECISION_RULE, "threshold_rule": THRESHOLD_RULE,
                   "decision": {"missing_runs": [s.name for s in grid]}}
    summary.update(command=command, settings=json.loads(json.dumps(asdict(settings), default=str)),
                   pilot=pilot_rows, seconds_this_invocation=time.perf_counter() - start)
    summary_json = write_study_summary_json(output / "summary.json", summary)
    return EmergenceOutcome(write_report(output, summary, pilot_rows), summary_json, summary)
