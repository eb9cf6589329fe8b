"""The GPU study's corpus: cplm_megatron.data.code_corpus over this interpreter's standard library and
site-packages, with the corpus's own split rules."""
from __future__ import annotations

import shutil
from pathlib import Path

from cplm_megatron.experiments.gpu_study.record import Record
from cplm_megatron.experiments.gpu_study.sizes import Sizes


def build_corpus(work: Path, sizes: Sizes, record: Record) -> Path:
    """The code corpus of this machine's installed sources (the split rules are the corpus's defaults) -> WORK/runs/
    code (the shards stay out of the check's tarball; its split.json is copied to WORK/study_split.json)."""
    from cplm_megatron.data.code_corpus import SPLIT_RECORD, CodeCorpusSettings, build_code_corpus

    settings = CodeCorpusSettings(vocab_size=sizes.vocab_size, seq_len=sizes.seq_len,
                                  tokenizer_sample_bytes=sizes.tokenizer_sample_bytes)
    corpus = build_code_corpus(work / "runs" / "code", settings, max_bytes=sizes.corpus_bytes, show_progress=False)
    shutil.copy(corpus.root / SPLIT_RECORD, work / "study_split.json")
    r = corpus.record
    record.data["corpus"] = {
        "seconds": r["seconds"], "workers": r["workers"], "python": r["python"],
        "distributions": len(r["distributions"]), "source_bytes": sum(d["bytes"] for d in r["distributions"]),
        "splits": {k: {f: v[f] for f in ("distributions", "documents", "tokens", "bytes")} for k, v in r["splits"].items()},
        "split_rules": r["split_rules"], "vocab_size": r["tokenizer"]["vocab_size"],
        "val_largest_document_share": r["splits"]["val"]["largest_document_share"],
        "val_shingles_in_train": r["held_out_overlap"]["val"]["fraction_in_train"],
        "val_files_in_train": r["held_out_overlap"]["val"]["files_in_train"]}
    return corpus.root
