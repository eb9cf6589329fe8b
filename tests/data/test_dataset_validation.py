"""Bad datasets fail early with errors that name the file and the values (and how to fix them)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cplm_megatron.data.config import BatchShape, DataConfig
from cplm_megatron.data.loader import build_train_loader, build_val_loader
from cplm_megatron.data.manifest import DatasetError
from cplm_megatron.errors import ConfigError
from tests.data_fixtures import (
    numbered_docs,
    synthetic_tokenizer,
    write_synthetic_dataset,
)

pytestmark = pytest.mark.usefixtures("isolated_streaming")
SEQ = 16


@pytest.fixture(scope="module")
def good_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("valid") / "ds"
    write_synthetic_dataset(path, numbered_docs(48, SEQ, doc_len=21), SEQ, shard_size_limit=1 << 9)
    return path


def copy_of(dataset: Path, tmp_path: Path) -> Path:
    # *.tmp: a shard an earlier test's loader may still be decompressing in streaming's background thread
    return Path(shutil.copytree(dataset, tmp_path / "copy", ignore=shutil.ignore_patterns("*.tmp")))


def train_cfg(*paths: Path, **overrides) -> DataConfig:
    return DataConfig(**{"streams": [{"path": str(p)} for p in paths], **overrides})


SHAPE = BatchShape(SEQ, micro_batch=2, global_batch=2)


def first_shard(dataset: Path) -> Path:
    return dataset / json.loads((dataset / "index.json").read_text())["shards"][0]["zip_data"]["basename"]


def test_good_dataset_loads(good_dataset: Path) -> None:
    assert next(build_train_loader(train_cfg(good_dataset), SHAPE, 0, 1, model_vocab_size=4096))["tokens"].shape == (2, SEQ)


def test_not_a_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"dataset directory not found: .*nowhere; prepare one with tools/prepare_data\.py .*make data"):
        build_train_loader(train_cfg(tmp_path / "nowhere"), SHAPE, 0, 1)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "index.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"half is not a prepared dataset \(no manifest\.json.*prepare_data"):
        build_train_loader(train_cfg(tmp_path / "half"), SHAPE, 0, 1)


def test_truncated_shard_names_file_and_sizes(good_dataset: Path, tmp_path: Path) -> None:
    shard = first_shard(copy_of(good_dataset, tmp_path))
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])
    with pytest.raises(DatasetError, match=rf"shard corrupt: .*{shard.name} has {size // 2} bytes but index\.json says {size}"):
        build_train_loader(train_cfg(tmp_path / "copy"), SHAPE, 0, 1)


def test_altered_shard_fails_its_hash(good_dataset: Path, tmp_path: Path) -> None:
    shard = first_shard(copy_of(good_dataset, tmp_path))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=rf"shard corrupt: .*{shard.name} has xxh3_64 [0-9a-f]+ but index\.json says"):
        build_train_loader(train_cfg(tmp_path / "copy"), SHAPE, 0, 1)


def test_corruption_found_while_streaming_is_not_a_silent_short_epoch(
    good_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = first_shard(copy_of(good_dataset, tmp_path))
    shard.with_suffix("").unlink(missing_ok=True)  # force streaming to decompress (and hash-check) it
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    loader = build_train_loader(train_cfg(tmp_path / "copy", verify_shards=False, shuffle=False), SHAPE, 0, 1)
    # streaming finds it in the reading thread or in its download thread (whose error used to be a logged traceback
    # and an epoch ending early); either way one DatasetError naming the shard and the fix (issue 30 item 6)
    with pytest.raises(DatasetError, match=rf"^shard corrupt: {re.escape(str(shard))} does not match the checksum in "
                                           r"its dataset's index.json .*re-run tools/prepare_data.py"):
        for _ in range(24):
            next(loader)
    assert "Traceback" not in caplog.text


def test_missing_shard_is_named(good_dataset: Path, tmp_path: Path) -> None:
    shard = first_shard(copy_of(good_dataset, tmp_path))
    shard.unlink()
    shard.with_suffix("").unlink(missing_ok=True)  # the raw form, if an earlier read decompressed it
    with pytest.raises(DatasetError, match=rf"shard missing: .*shard\.00000\.mds or {shard.name}"):
        build_train_loader(train_cfg(tmp_path / "copy"), SHAPE, 0, 1)


def test_tokenizer_larger_than_model_vocab(good_dataset: Path) -> None:
    with pytest.raises(DatasetError, match=r"ds: its tokenizer \('synthetic'\) has 4096 tokens but the model's "
                                           r"vocabulary has only 1000; set model\.vocab_size to at least 4096"):
        build_train_loader(train_cfg(good_dataset), SHAPE, 0, 1, model_vocab_size=1000)


def test_seq_len_mismatch(good_dataset: Path) -> None:
    with pytest.raises(DatasetError, match=r"ds: shards hold samples of seq_len 16 but the config has seq_len 32; "
                                           r"set train\.seq_len=16 or re-run tools/prepare_data\.py --seq-len 32"):
        build_val_loader(DataConfig(val_streams=[{"path": str(good_dataset)}]), BatchShape(32, 2, 2), 0, 1)


def test_streams_with_different_tokenizers(good_dataset: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_synthetic_dataset(other, numbered_docs(8, SEQ, doc_len=21), SEQ, tokenizer=synthetic_tokenizer(name="other"))
    with pytest.raises(DatasetError, match=r"other was tokenized with 'other' .* but .*ds with 'synthetic' .*one tokenizer"):
        build_train_loader(train_cfg(good_dataset, other), SHAPE, 0, 1)


def test_validation_and_training_streams_must_share_a_tokenizer(good_dataset: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_synthetic_dataset(other, numbered_docs(8, SEQ, doc_len=21), SEQ, tokenizer=synthetic_tokenizer(name="other"))
    cfg = train_cfg(good_dataset, val_streams=[{"path": str(other), "name": "heldout"}])
    with pytest.raises(DatasetError, match=r"ds was tokenized with 'synthetic' .* but heldout with 'other'"):
        build_val_loader(cfg, SHAPE, 0, 1)


def test_too_little_data_for_one_micro_batch(tmp_path: Path) -> None:
    write_synthetic_dataset(tmp_path / "small", numbered_docs(3, SEQ, doc_len=21), SEQ)
    with pytest.raises(DatasetError, match=r"3 samples per epoch, fewer than micro_batch \* dp_size = 4 \* 1"):
        build_train_loader(train_cfg(tmp_path / "small"), BatchShape(SEQ, 4, 4), 0, 1)


def test_config_errors_name_the_key(good_dataset: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.global_batch=6 must be a multiple of train\.micro_batch \* "
                                          r"data-parallel size = 2 \* 2 = 4"):
        build_train_loader(train_cfg(good_dataset), BatchShape(SEQ, 2, 6), 0, 2)
    with pytest.raises(ConfigError, match=r"data.streams\[1\]: give at most one of proportion/repeat/choose"):
        DataConfig(streams=[{"path": "a"}, {"path": "b", "repeat": 2, "choose": 3}]).validate()
    with pytest.raises(ConfigError, match=r"data.streams: give a proportion for every stream or for none"):
        DataConfig(streams=[{"path": "a", "proportion": 0.5}, {"path": "b"}]).validate()
    with pytest.raises(ConfigError, match=r"data.val_streams lists \['a'\] more than once"):
        DataConfig(val_streams=["a", "a"]).validate()
    with pytest.raises(ConfigError, match=r"unknown keys \['weight'\]"):
        DataConfig(streams=[{"path": "a", "weight": 1}])
    with pytest.raises(DatasetError, match="val_streams is empty"):
        build_val_loader(train_cfg(good_dataset), SHAPE, 0, 1)


def test_token_ids_outside_the_vocabulary_are_an_error_even_without_verification(tmp_path: Path) -> None:
    """A shard whose bytes were altered at the same size passes the size check; with data.verify_shards=false
    (no hashes) the loader still refuses ids the tokenizer cannot produce instead of handing them to the
    embedding (an IndexError on CPU, undefined behaviour on GPU)."""
    import numpy as np
    import zstd

    ds = tmp_path / "ds"
    write_synthetic_dataset(ds, numbered_docs(8, SEQ, doc_len=21), SEQ, shard_size_limit=1 << 16)
    [shard] = json.loads((ds / "index.json").read_text())["shards"]
    raw = zstd.decompress((ds / shard["zip_data"]["basename"]).read_bytes())
    tokens_7_8 = np.array([7, 8], dtype=np.uint16).tobytes()  # ids 7, 8 follow each other in the first document
    assert raw.count(tokens_7_8) == 1
    (ds / shard["raw_data"]["basename"]).write_bytes(raw.replace(tokens_7_8, np.array([7, 60000], np.uint16).tobytes()))
    loader = build_train_loader(train_cfg(ds, verify_shards=False, shuffle=False), SHAPE, 0, 1, model_vocab_size=4096)
    with pytest.raises(DatasetError, match=r"training epoch 0: micro-batch 0 holds token id 60000, outside the "
                                           r"vocabulary of the dataset's tokenizer \('synthetic', 4096 tokens\)"):
        next(loader)


def test_resume_position_from_data_with_another_tokenizer_is_refused(good_dataset: Path, tmp_path: Path) -> None:
    state = build_train_loader(train_cfg(good_dataset), SHAPE, 0, 1).state_dict()
    other = tmp_path / "other"  # the same shape of data, tokenized with another tokenizer
    write_synthetic_dataset(other, numbered_docs(48, SEQ, doc_len=21), SEQ, tokenizer=synthetic_tokenizer(name="other"),
                            shard_size_limit=1 << 9)
    with pytest.raises(DatasetError, match=r"the checkpoint was trained on data tokenized with 'synthetic' \(sha256 "
                                           r"[0-9a-f]{12}\) but data.streams use 'other'"):
        build_train_loader(train_cfg(other), SHAPE, 0, 1).load_state_dict(state)
    del state["tokenizer"], state["tokenizer_sha256"]  # saved before the tokenizer was recorded: accepted as before
    build_train_loader(train_cfg(other), SHAPE, 0, 1).load_state_dict(state)


def test_a_sample_that_cannot_be_decoded_mid_epoch_is_one_error_naming_it(tmp_path: Path) -> None:
    """With data.verify_shards=false a shard damaged at the same size is read as it is: a sample whose bytes do not
    decode was a 73-line traceback in the middle of a run (issue 43 item 9); it is a DatasetError naming the sample
    and the shard (the trainer: one line, exit 2, its checkpoints intact)."""
    import struct

    import numpy as np
    import zstd

    ds = tmp_path / "ds"
    write_synthetic_dataset(ds, numbered_docs(8, SEQ, doc_len=21), SEQ, shard_size_limit=1 << 16)
    [shard] = json.loads((ds / "index.json").read_text())["shards"]
    raw = bytearray(zstd.decompress((ds / shard["zip_data"]["basename"]).read_bytes()))
    count = struct.unpack("<I", raw[:4])[0]
    begin = int(np.frombuffer(bytes(raw[4:8 + 4 * count]), np.uint32)[5])
    raw[begin:begin + 4] = struct.pack("<I", 0x7FFFFFF0)  # sample 5's length of its variable-size column
    (ds / shard["raw_data"]["basename"]).write_bytes(bytes(raw))
    loader = build_train_loader(train_cfg(ds, verify_shards=False, shuffle=False), SHAPE, 0, 1)
    next(loader)
    next(loader)  # samples 0-3: intact
    with pytest.raises(DatasetError, match=rf"^shard corrupt: sample 5 of {ds}/shard.00000.mds cannot be decoded "
                                           r"\(ValueError: .*\); re-run tools/prepare_data.py") as error:
        next(loader)
    assert "\n" not in str(error.value)
