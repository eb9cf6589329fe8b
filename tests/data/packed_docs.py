"""Read a packed dataset back as documents (the tests of parts/merge and of the SLURM data-preparation job)."""
from __future__ import annotations

from pathlib import Path

from cplm_megatron.data.config import BatchShape, DataConfig
from cplm_megatron.data.loader import build_val_loader


def loader_samples(dataset_dir: Path, seq_len: int) -> list[list[int]]:
    """Every sample's real tokens (tokens[:num_tokens]) in dataset order, as the project's loader delivers them."""
    cfg = DataConfig(val_streams=[{"path": str(dataset_dir)}])
    samples = []
    for batch in build_val_loader(cfg, BatchShape(seq_len, 1, 1), 0, 1, keep_last=True):
        samples.append([int(batch["tokens"][0, 0])] + batch["labels"][0][batch["loss_mask"][0] == 1].tolist())
    return samples


def documents_of(samples: list[list[int]], part_samples: list[int], eod: int) -> list[tuple[int, ...]]:
    """The documents (EOD included) of a packed dataset whose parts hold `part_samples` samples each: within a
    part consecutive samples share one token; each part's stream is cut after every EOD."""
    docs: list[tuple[int, ...]] = []
    start = 0
    for count in part_samples:
        stream: list[int] = []
        for k, sample in enumerate(samples[start:start + count]):
            stream += sample if k == 0 else sample[1:]
        start += count
        doc: list[int] = []
        for token in stream:
            doc.append(token)
            if token == eod:
                docs.append(tuple(doc))
                doc = []
        assert not doc, "a part's stream must end with an EOD"
    assert start == len(samples)
    return docs
