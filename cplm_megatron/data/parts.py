"""Join the parts of a dataset prepared as N jobs (`prepare_dataset(..., part=(I, N))`) into one dataset.

    OUTPUT/part-00001-of-00003/  index.json shard.*.mds.zstd manifest.json   (one per `--part I/3`)
    OUTPUT/index.json      mosaicml-streaming's `merge_index` of the parts' indexes (shard paths
                           become part-0000I-of-0000N/shard.*), parts in order 1..N
    OUTPUT/manifest.json   the parts' manifests summed (documents, tokens, samples, padding); written last

The loader reads OUTPUT like any other dataset. Its documents are exactly those of one `prepare_data` run
over the same inputs; only the packing differs at part edges (each part's last sample is padded). Every
part must be present and complete (its manifest), whole (shard sizes against its index.json) and made with
the same inputs, tokenizer and settings. A rerun whose parts are unchanged does nothing ("up to date").
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.data.atomic_output import OutputError, _exclusive_lock, fingerprint, read_marker
from cplm_megatron.data.inputs import part_dir_name
from cplm_megatron.data.manifest import MANIFEST_NAME, DatasetError, DatasetManifest, read_manifest, write_manifest
from cplm_megatron.data.shards import INDEX_NAME, verify_local_shards

_PART_DIR = re.compile(r"^part-(\d{5})-of-(\d{5})$")
_SUMMED_SETTINGS = ("empty_documents_skipped", "documents_with_invalid_utf8")


@dataclass
class MergeResult:
    """What `merge_parts` produced."""

    output: Path
    manifest: DatasetManifest
    parts: int
    rebuilt: bool  # False: already merged from these very parts

    def summary(self) -> dict[str, object]:
        """What `tools/prepare_data.py --merge` prints (JSON)."""
        m = self.manifest
        return {"status": "merged" if self.rebuilt else "up to date", "output": str(self.output), "parts": self.parts,
                "documents": m.documents, "tokens": m.tokens, "samples": m.samples, "seq_len": m.seq_len,
                "tokenizer": m.tokenizer.name}


def find_part_count(output: Path) -> int:
    """N, from the part-*-of-N directories in `output` (all must agree)."""
    counts = {int(m.group(2)) for d in Path(output).iterdir() if d.is_dir() and (m := _PART_DIR.match(d.name))}
    if not counts:
        raise DatasetError(f"{output} holds no part-IIIII-of-NNNNN directories; run "
                           f"tools/prepare_data.py --part I/N --output {output} for I = 1..N first")
    if len(counts) > 1:
        raise DatasetError(f"{output} holds parts of different splits (N = {', '.join(map(str, sorted(counts)))}); "
                           f"remove the stale part directories or merge into a fresh --output")
    return counts.pop()


def _read_part(output: Path, index: int, count: int) -> DatasetManifest:
    part = output / part_dir_name(index, count)
    if not (part / MANIFEST_NAME).is_file():
        state = ("was interrupted or is still running" if any(part.parent.glob(f".{part.name}.tmp-*"))
                 else "never ran")
        raise DatasetError(f"part {index}/{count} is missing ({part} has no {MANIFEST_NAME}: the part {state}); "
                           f"run tools/prepare_data.py --part {index}/{count} with the same arguments, then merge")
    manifest = read_manifest(str(part))
    info = manifest.settings.get("part") or {}
    if (info.get("index"), info.get("count")) != (index, count):
        raise DatasetError(f"{part}/{MANIFEST_NAME} does not describe part {index}/{count}; rebuild that part")
    verify_local_shards(part, check_hashes=False)
    return manifest


def merge_parts(output: str | Path, expected_parts: int | None = None) -> MergeResult:
    """Merge OUTPUT/part-*-of-N into a dataset at OUTPUT (see the module doc)."""
    importlib.import_module("cplm_megatron.data._streaming_import")  # stubs streaming.vision before streaming loads
    merge_index = importlib.import_module("streaming.base.util").merge_index

    output = Path(output).resolve()
    if not output.is_dir():
        raise DatasetError(f"--output {output} does not exist; run the parts (tools/prepare_data.py --part I/N) first")
    count = find_part_count(output)
    if expected_parts is not None and expected_parts != count:
        raise DatasetError(f"{output} holds parts of N = {count}, not the {expected_parts} asked for")
    with _exclusive_lock(output):
        manifests = [_read_part(output, i, count) for i in range(1, count + 1)]
        first = manifests[0]
        key = first.settings["part"]
        for i, m in enumerate(manifests, start=1):
            info = m.settings["part"]
            if info.get("inputs") != key.get("inputs"):
                raise DatasetError(f"part {i}/{count} was prepared from other inputs ({info.get('inputs')}) than "
                                   f"part 1 ({key.get('inputs')}); rerun it with the same --input")
            if info.get("listing") != key.get("listing"):
                seen = [str(x.get("listing", "?")).split(":")[0] for x in (info, key)]
                raise DatasetError(f"part {i}/{count} listed {seen[0]} input files, part 1 listed {seen[1]} (or other "
                                   f"paths): the inputs changed between the parts' runs, or the nodes see the files "
                                   f"under other paths; rerun every part over the same files")
            if info.get("build") != key.get("build") or m.tokenizer != first.tokenizer:
                raise DatasetError(f"part {i}/{count} was prepared with another tokenizer or other settings "
                                   f"(--seq-len, --split-by, --text-field, --shard-size) than part 1; rerun it "
                                   f"with the same arguments")
        merged_fingerprint = fingerprint({"merge": [m.fingerprint for m in manifests], "count": count})
        marker = read_marker(output, MANIFEST_NAME)
        if (marker is not None and marker.get("fingerprint") == merged_fingerprint
                and (output / INDEX_NAME).is_file()):
            return MergeResult(output, read_manifest(str(output)), count, rebuilt=False)
        if marker is None and (output / INDEX_NAME).exists():
            raise OutputError(f"{output}/{INDEX_NAME} exists but was not written by a merge (no {MANIFEST_NAME}); "
                              f"remove it or choose another --output")
        (output / MANIFEST_NAME).unlink(missing_ok=True)  # the marker goes first, so a torn merge is never complete
        nonempty = [output / part_dir_name(i, count) / INDEX_NAME
                    for i, m in enumerate(manifests, start=1) if m.samples > 0]
        if not nonempty:
            raise DatasetError(f"all {count} parts in {output} are empty: the inputs hold no documents")
        tmp_index = output / f".{INDEX_NAME}.merging"
        tmp_index.mkdir(exist_ok=True)
        streaming_log = logging.getLogger()  # merge_index warns about its temporary folder on the root logger
        level = streaming_log.level
        streaming_log.setLevel(logging.ERROR)
        try:
            merge_index([str(p) for p in nonempty], str(tmp_index), keep_local=True)
        finally:
            streaming_log.setLevel(level)
        os.replace(tmp_index / INDEX_NAME, output / INDEX_NAME)
        tmp_index.rmdir()
        settings = {k: v for k, v in first.settings.items() if k not in ("part", *_SUMMED_SETTINGS)}
        for name in _SUMMED_SETTINGS:
            settings[name] = sum(int(m.settings.get(name, 0)) for m in manifests)
        settings["parts"] = [{"name": part_dir_name(i, count), "documents": m.documents, "tokens": m.tokens,
                              "samples": m.samples, "fingerprint": m.fingerprint}
                             for i, m in enumerate(manifests, start=1)]
        settings["inputs"] = key.get("inputs")
        manifest = DatasetManifest(
            seq_len=first.seq_len,
            documents=sum(m.documents for m in manifests),
            tokens=sum(m.tokens for m in manifests),
            samples=sum(m.samples for m in manifests),
            padding_tokens=sum(m.padding_tokens for m in manifests),
            token_dtype=first.token_dtype,
            tokenizer=first.tokenizer,
            source_files=[f for m in manifests for f in m.source_files],
            fingerprint=merged_fingerprint,
            settings=settings,
        )
        if verify_local_shards(output, check_hashes=False) != manifest.samples:
            raise DatasetError(f"{output}/{INDEX_NAME}: the merged index does not hold the parts' {manifest.samples} "
                               f"samples; rerun the merge")
        write_manifest(output, manifest)
    return MergeResult(output, manifest, count, rebuilt=True)


def merged_index_shards(output: Path) -> list[str]:
    """The shard files the merged index lists (for tests and tools)."""
    shards = json.loads((Path(output) / INDEX_NAME).read_text())["shards"]
    return [(s.get("zip_data") or s["raw_data"])["basename"] for s in shards]
