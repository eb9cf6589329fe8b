"""Find and check training checkpoints on disk: the one lookup used by resume, evaluation and conversion.

Layout (written by `cplm_megatron.checkpoint.checkpointer`) under a checkpoint root, `<run.dir>/checkpoints/`:

    iter_0000100/   metadata.json, .metadata and *.distcp (torch_dist), common.pt (megatron-core 0.16;
                    0.19 keeps the common state in the torch_dist files), and last
                    cplm_state.json, which marks the save as finished (a "committed" checkpoint) and records
                    every other file's size and checksum (`content_damage` compares them)
    latest          "iter_0000100", moved only after every rank finished a save
    latest.trainer  the name the trainer last wrote to `latest` (written right after it): a `latest` that
                    points older than this was moved back by a person (a rollback); a `latest` equal to it
                    with a newer committed checkpoint means the run stopped between the commit and the move

A path given by the user may be a run dir, its checkpoint root or one iter_* directory. Without a
readable `latest` the newest committed checkpoint is used, and the caller is told so. A checkpoint
that is missing, damaged or garbled is a `CheckpointError` naming it, what is missing and the fix
(point `latest` at the previous complete checkpoint). A reader checks a checkpoint's files against the checksums
recorded when it was saved (`resolve_verified`, `verify_contents`) before it reads anything: a changed file is
one CheckpointError naming the previous intact checkpoint, the same for every reader. No process group is needed.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TypeVar

from cplm_megatron.errors import CheckpointError, check_version

CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
TRAINER_LATEST = "latest.trainer"  # what the trainer itself last wrote to `latest`
SET_ASIDE_PREFIX = "set_aside_"  # <root>/set_aside_<time>/iter_*: newer checkpoints a rollback keeps aside
STATE_JSON = "cplm_state.json"  # written last: its presence commits a checkpoint
DIST_METADATA = "metadata.json"  # megatron.core.dist_checkpointing: which backend wrote the files
COMMON_STATE = "common.pt"  # iteration, scheduler, data position, run config (megatron-core 0.16)
COMMON_STATE_OBJECT = "common_state"  # the same, inside the torch_dist files (megatron-core 0.19)
TENSOR_INDEX = ".metadata"  # torch.distributed.checkpoint: which *.distcp file holds each tensor
_ITER_DIR = re.compile(r"^iter_(\d+)$")

Say = Callable[[str], None]
T = TypeVar("T")


@dataclass(frozen=True)
class CheckpointRef:
    """One committed checkpoint directory and the iteration it was saved at."""

    path: Path
    iteration: int


def iter_dir_name(iteration: int) -> str:
    """The directory name of the checkpoint of `iteration`."""
    return f"iter_{iteration:07d}"


def iteration_of(path: Path) -> Optional[int]:
    """The iteration an iter_* directory name encodes, else None."""
    match = _ITER_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_committed(path: Path) -> bool:
    """Whether a save of `path` finished (its cplm_state.json exists)."""
    return (Path(path) / STATE_JSON).is_file()


def list_checkpoints(root: Path) -> List[Path]:
    """Committed checkpoints under a checkpoint root, oldest first."""
    found = [p for p in Path(root).glob("iter_*") if iteration_of(p) is not None and is_committed(p)]
    return sorted(found, key=iteration_of)


def holds_checkpoints(root: Path) -> bool:
    """Whether a checkpoint root holds anything a fresh start would overwrite: `latest` or a committed checkpoint."""
    return (Path(root) / LATEST).exists() or bool(list_checkpoints(root))


def trainer_latest(root: Path) -> Optional[int]:
    """The iteration the trainer last pointed `latest` at (its `latest.trainer` record); None without one."""
    try:
        return iteration_of(Path((Path(root) / TRAINER_LATEST).read_text().strip()))
    except (OSError, UnicodeDecodeError):
        return None


def checkpoint_root(path: Path) -> Path:
    """`path` itself when it holds `latest` or iter_* directories, else `path/checkpoints` (a run dir)."""
    path = Path(path)
    if (path / LATEST).exists() or any(iteration_of(p) is not None for p in path.glob("iter_*")):
        return path
    return path / CHECKPOINTS_DIR


CHECKPOINT_RECORD_VERSION = 1
LAYOUT_KEYS = ("tp", "pp", "dp", "cp")


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint's cplm_state.json, written last (its presence commits the save): the training scalars, the
    layout it was saved under and whether it holds optimizer state. Readable without torch."""

    iteration: int
    consumed_tokens: int = 0
    skipped_steps: int = 0
    layout: Dict[str, int] = field(default_factory=lambda: {"tp": 1, "pp": 1, "dp": 1, "cp": 1})
    has_optimizer: bool = True  # false: weights only (converted or exported)
    version: int = CHECKPOINT_RECORD_VERSION
    # {file name: {"bytes": size, CHECKSUM_ALGORITHM: hex digest}} of every other file of the checkpoint, computed
    # from the files on disk when the save committed; None in records written before checksums were kept
    files: Optional[Dict[str, Dict[str, Any]]] = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @property
    def layout_text(self) -> str:
        return layout_text(self.layout)


def layout_text(layout: Dict[str, int]) -> str:
    """'tp=2 pp=1 dp=1 cp=1' (the keys a layout has, in that order)."""
    return " ".join(f"{k}={layout[k]}" for k in LAYOUT_KEYS if k in layout)


def read_record(path: Path) -> CheckpointRecord:
    """The cplm_state.json record of a committed checkpoint. Records written before it had a version read as
    version 1, and those written before the layout kept `cp` had cp=1."""
    file = Path(path) / STATE_JSON
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path}: {STATE_JSON} is unreadable ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("iteration"), int):
        raise CheckpointError(f"checkpoint {path}: {STATE_JSON} holds no iteration")
    check_version(file, data, "a checkpoint record", CHECKPOINT_RECORD_VERSION, CheckpointError,
                  "read it with the cplm_megatron that wrote it, or update this one")
    layout = data.get("layout")
    if not isinstance(layout, dict) or not all(isinstance(layout.get(k), int) for k in ("tp", "pp", "dp")):
        raise CheckpointError(f"checkpoint {path}: {STATE_JSON} has no layout (tp, pp, dp); it was not written by "
                              f"cplm_megatron's trainer")
    files = data.get("files")
    if files is not None and not (isinstance(files, dict) and all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get(CHECKSUM_ALGORITHM), str)
            for v in files.values())):
        raise CheckpointError(f"checkpoint {path}: {STATE_JSON} has a garbled file list (files: name -> bytes and "
                              f"{CHECKSUM_ALGORITHM})")
    known = {f.name for f in fields(CheckpointRecord)}
    return CheckpointRecord(**{**{k: v for k, v in data.items() if k in known},
                               "layout": {k: int(layout.get(k, 1)) for k in LAYOUT_KEYS},
                               "version": CHECKPOINT_RECORD_VERSION})


CHECKSUM_ALGORITHM = "xxh3_128"  # xxhash's 128-bit XXH3: ~10 GB/s per core, detects any flipped bits
_CHUNK = 16 << 20


def file_checksum(path: Path) -> str:
    """The CHECKSUM_ALGORITHM digest of a file, read in 16 MiB chunks."""
    import xxhash

    digest, buffer = xxhash.xxh3_128(), bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                return digest.hexdigest()
            digest.update(view[:n])


def checksum_files(path: Path, names: List[str]) -> Dict[str, Dict[str, Any]]:
    """{name: {"bytes": size, CHECKSUM_ALGORITHM: digest}} of the files `names` of the checkpoint `path`."""
    return {name: {"bytes": (Path(path) / name).stat().st_size, CHECKSUM_ALGORITHM: file_checksum(Path(path) / name)}
            for name in names}


def checkpoint_files(path: Path) -> List[str]:
    """The files a checkpoint's checksums cover: every file in it but the record itself and temporaries, sorted."""
    return sorted(p.name for p in Path(path).iterdir()
                  if p.is_file() and p.name != STATE_JSON and not p.name.endswith(".tmp"))


def content_damage(path: Path, record: CheckpointRecord, names: Optional[List[str]] = None) -> List[str]:
    """The recorded files of checkpoint `path` (all, or those in `names`) that are missing or differ from the
    checksums recorded when it was saved (empty: intact, or saved before checksums were kept)."""
    if record.files is None:
        return []
    problems = []
    for name in sorted(record.files) if names is None else names:
        expected, file = record.files[name], Path(path) / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size != expected["bytes"]:
            problems.append(f"{name} has {file.stat().st_size} bytes, {expected['bytes']} when saved")
        elif file_checksum(file) != expected[CHECKSUM_ALGORITHM]:
            problems.append(f"{name} differs from its checksum ({CHECKSUM_ALGORITHM}) recorded when it was saved")
    return problems


def is_intact(path: Path) -> bool:
    """Whether a committed checkpoint is complete and its files match their recorded checksums (reads them all)."""
    return not checkpoint_damage(path) and not content_damage(path, read_record(path))


def _index_problems(path: Path) -> tuple[List[str], bool]:
    """Missing or truncated *.distcp files, from the torch_dist tensor index; and whether the index holds
    the common state (megatron-core 0.19 saves it as the sharded object `common_state`, not common.pt)."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # noqa: BLE001 - a corrupt pickle raises anything
        return [f"{TENSOR_INDEX} (the tensor index) is unreadable: {type(e).__name__}: {e}"], False
    common_in_index = any(key.startswith(COMMON_STATE_OBJECT) for key in metadata.state_dict_metadata)
    needed: Dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    problems = []
    missing = sorted(name for name in needed if not (path / name).is_file())
    if missing:
        problems.append(f"shard file{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                        f"{'are' if len(missing) > 1 else 'is'} missing")
    for name, size in sorted(needed.items()):
        if name not in missing and (path / name).stat().st_size < size:
            problems.append(f"{name} is truncated ({(path / name).stat().st_size} bytes, the index needs {size})")
    return problems, common_in_index


def checkpoint_damage(path: Path) -> List[str]:
    """What is missing or damaged in a checkpoint directory (empty: it is complete and readable)."""
    path = Path(path)
    if not path.is_dir():
        return ["the directory does not exist"]
    problems = []
    if not (path / STATE_JSON).is_file():
        problems.append(f"{STATE_JSON} is missing (the save never finished)")
    else:
        try:
            record = read_record(path)
            named = iteration_of(path)
            if named is not None and record.iteration != named:
                problems.append(f"{STATE_JSON} says iteration {record.iteration}, its directory name iteration "
                                f"{named} (renamed or copied over)")
        except CheckpointError as e:
            problems.append(str(e).split(": ", 1)[1])
    try:
        backend = json.loads((path / DIST_METADATA).read_text()).get("sharded_backend")
        if backend != "torch_dist":
            problems.append(f"{DIST_METADATA} names sharded_backend={backend!r}, not torch_dist")
    except FileNotFoundError:
        problems.append(f"{DIST_METADATA} is missing")
    except (OSError, ValueError, AttributeError) as e:
        problems.append(f"{DIST_METADATA} is unreadable ({e})")
    common_in_index = False
    if not (path / TENSOR_INDEX).is_file():
        problems.append(f"{TENSOR_INDEX} (the tensor index) is missing")
    else:
        index_problems, common_in_index = _index_problems(path)
        problems += index_problems
    if not (path / COMMON_STATE).is_file() and not common_in_index:
        problems.append(f"{COMMON_STATE} (iteration, scheduler, data position, config) is missing")
    return problems


def _previous_complete(root: Path, before: Optional[int], contents: bool = False) -> Optional[Path]:
    """The newest committed, undamaged checkpoint older than iteration `before` (any, if None); `contents`: whose
    files also match their checksums (reads them)."""
    for candidate in reversed(list_checkpoints(root)):
        if before is not None and iteration_of(candidate) >= before:
            continue
        if (is_intact(candidate) if contents else not checkpoint_damage(candidate)):
            return candidate
    return None


def damaged_contents_message(path: Path, problems: List[str]) -> str:
    """The one line refusing checkpoint `path` whose files differ from their checksums: what differs, and the
    previous intact checkpoint with the command that resumes from it (its files are read to check them)."""
    path = Path(path)
    root = path.parent
    previous = _previous_complete(root, iteration_of(path), contents=True)
    if previous is None:
        fix = (f"no older intact checkpoint exists under {root}: restore the files from a copy, or start over with "
               f"--set checkpoint.resume=false checkpoint.overwrite=true (deletes {root})")
    elif (root / LATEST).is_file():
        fix = (f"the previous intact checkpoint is {previous.name}: resume from it with echo {previous.name} > "
               f"{root / LATEST} (the damaged one is then kept aside, not deleted)")
    else:
        fix = f"the previous intact checkpoint is {previous}: load that one instead"
    return f"checkpoint {path} is damaged: {'; '.join(problems)}; {fix}"


def verify_contents(path: Path) -> None:
    """Single process: the files of the committed checkpoint `path` against the checksums recorded when it was
    saved; a difference is a CheckpointError naming the previous intact checkpoint (`damaged_contents_message`).
    Every reader runs it before reading anything (training runs its collective twin, checkpointer._verify_contents,
    each rank checking its share)."""
    problems = content_damage(path, read_record(path))
    if problems:
        raise CheckpointError(damaged_contents_message(Path(path), problems))


def newest_complete(root: Path, other_than: Optional[int] = None) -> Optional[Path]:
    """The newest committed, undamaged checkpoint under `root` (skipping iteration `other_than`)."""
    for candidate in reversed(list_checkpoints(root)):
        if iteration_of(candidate) != other_than and not checkpoint_damage(candidate):
            return candidate
    return None


def repoint_fix(root: Path, before: Optional[int]) -> str:
    """The fix for a bad checkpoint `latest` leads to: point `latest` at the previous complete one (or, when
    only newer ones are complete, the newest). Deleting is suggested only when no complete checkpoint exists."""
    previous = _previous_complete(root, before)
    if previous is not None:
        return (f"point latest at the previous complete checkpoint: echo {previous.name} > {root / LATEST} "
                f"(or restore the missing files)")
    newest = newest_complete(root, other_than=before)
    if newest is not None:
        return (f"point latest at the complete checkpoint {newest.name}: echo {newest.name} > {root / LATEST} "
                f"(or restore the missing files)")
    return (f"no other complete checkpoint exists under {root}: restore the missing files, or start over "
            f"with --set checkpoint.resume=false checkpoint.overwrite=true (deletes {root})")


def read_latest(root: Path) -> Optional[Path]:
    """The committed checkpoint `latest` points at; None without a `latest` file. A garbled or dangling
    `latest` is a CheckpointError naming the fix."""
    root = Path(root)
    marker = root / LATEST
    if not marker.exists():
        return None
    try:
        name = marker.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{marker} is unreadable ({e}); {repoint_fix(root, None)}") from e
    if iteration_of(Path(name)) is None or "/" in name:
        raise CheckpointError(f"{marker} is garbled: it holds {name[:60]!r}, not an iter_NNNNNNN name; "
                              f"{repoint_fix(root, None)}")
    path = root / name
    if not path.is_dir():
        raise CheckpointError(f"{marker} points at {name}, which does not exist; {repoint_fix(root, iteration_of(path))}")
    if not is_committed(path):
        raise CheckpointError(f"{marker} points at {name}, whose save never finished ({STATE_JSON} is missing); "
                              f"{repoint_fix(root, iteration_of(path))}")
    return path


def verify_checkpoint(path: Path, fix: Optional[str] = None) -> CheckpointRef:
    """`path` as a CheckpointRef if it is complete and readable, else a CheckpointError naming the damage."""
    path = Path(path)
    problems = checkpoint_damage(path)
    if problems:
        if fix is None:
            previous = _previous_complete(path.parent, iteration_of(path))
            fix = (f"use the previous complete checkpoint {previous}" if previous is not None
                   else "restore the missing files")
        raise CheckpointError(f"checkpoint {path} is damaged: {'; '.join(problems)}; {fix}")
    return CheckpointRef(path, read_record(path).iteration)


def _say_to_log(message: str) -> None:
    import logging

    logging.getLogger(__name__).warning(message)


def find_checkpoint(path: Path, say: Say = _say_to_log) -> Optional[CheckpointRef]:
    """The checkpoint `path` names, verified; None when there is none at all (nothing committed, no `latest`).

    `path`: an iter_* directory (used as is), a checkpoint root or a run dir (`latest`, or without it the
    newest committed checkpoint, announced through `say`)."""
    path = Path(path)
    if path.is_dir() and (iteration_of(path) is not None or (path / DIST_METADATA).is_file()) and not (
            path / CHECKPOINTS_DIR).is_dir():
        return verify_checkpoint(path)
    root = checkpoint_root(path)
    chosen = read_latest(root)
    if chosen is None:
        committed = list_checkpoints(root)
        if not committed:
            return None
        chosen = committed[-1]
        say(f"[checkpoint] {root / LATEST} is missing: using the newest complete checkpoint {chosen.name}")
    return verify_checkpoint(chosen, repoint_fix(root, iteration_of(chosen)))


def resolve_checkpoint(path: Path, say: Say = _say_to_log) -> CheckpointRef:
    """Like `find_checkpoint`, but a path without any checkpoint is a CheckpointError."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist; pass a run dir (run.dir), its "
                              f"{CHECKPOINTS_DIR}/ directory or one {CHECKPOINTS_DIR}/iter_* directory")
    ref = find_checkpoint(path, say)
    if ref is None:
        root = checkpoint_root(path)
        raise CheckpointError(f"no complete checkpoint under {path} (looked for {root / LATEST} and "
                              f"{root}/iter_*/{STATE_JSON}); did the training run save one?")
    return ref


def resolve_verified(path: Path, say: Say = _say_to_log) -> CheckpointRef:
    """`resolve_checkpoint`, its files then checked against their checksums (`verify_contents`): what a reader
    outside training (evaluation, conversion, weights-only loads) calls before it reads a checkpoint."""
    ref = resolve_checkpoint(path, say)
    verify_contents(ref.path)
    return ref


def was_pruned(ref: CheckpointRef) -> bool:
    """Whether a checkpoint that was complete when found is gone or uncommitted now (a running trainer pruned
    it, keeping only the newest checkpoint.keep)."""
    return not is_committed(ref.path)


def read_live(path: Path, read: Callable[[CheckpointRef], T], say: Say = _say_to_log, attempts: int = 3) -> T:
    """`read(ref)` of the checkpoint `path` names, safe against a run that is still training: when pruning
    removes the checkpoint while it is read, retry with the newest complete one (a path naming one iter_*
    directory is not replaced: the error names the newest). Other failures propagate unchanged."""
    path = Path(path)
    for attempt in range(attempts):
        ref = resolve_checkpoint(path, say)
        try:
            return read(ref)
        except BaseException as e:  # a vanishing file fails inside torch in many ways (some BaseExceptions)
            if isinstance(e, (KeyboardInterrupt, SystemExit)) or not was_pruned(ref):
                raise
            newest = newest_complete(ref.path.parent)
            if ref.path == path or attempt == attempts - 1:
                raise CheckpointError(
                    f"checkpoint {ref.path} was removed while being read (the run still training pruned it: it keeps "
                    f"the newest checkpoint.keep); read the newest complete one"
                    f"{f': {newest}' if newest is not None else ''} (or raise checkpoint.keep while reading)") from e
            say(f"[checkpoint] {ref.path.name} was removed while being read (pruned by the run still training): "
                f"retrying with the newest complete checkpoint{f' {newest.name}' if newest is not None else ''}")
    raise AssertionError("unreachable")


def all_checkpoints(path: Path) -> List[CheckpointRef]:
    """Every committed checkpoint of a run dir (or checkpoint root), verified, by increasing iteration."""
    root = checkpoint_root(Path(path))
    found = list_checkpoints(root)
    if not found:
        raise CheckpointError(f"no complete checkpoint under {path} (looked in {root}/iter_*)")
    return [verify_checkpoint(p) for p in found]


def read_saved_config(path: Path) -> Dict[str, Any]:
    """The resolved run config (a plain dict) saved in a checkpoint's common state."""
    from megatron.core.dist_checkpointing import load_common_state_dict
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    from cplm_megatron.checkpoint.storage import error_chain

    try:
        common = load_common_state_dict(str(path))
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - torch.load of a damaged file raises anything
        if is_committed(path):  # a file changed since the save: named by its checksum, with the intact checkpoint
            verify_contents(path)
        e = next((x for x in error_chain(e) if not isinstance(x, CheckpointException)), e)  # the rank's own error
        what = next((line for line in str(e).splitlines() if line.strip()), "").split(". ")[0]  # one sentence
        raise CheckpointError(f"checkpoint {path}: {COMMON_STATE} is unreadable ({type(e).__name__}: {what}); "
                              f"{repoint_fix(Path(path).parent, iteration_of(Path(path)))}") from e
    config = common.get("config") if isinstance(common, dict) else None
    if not isinstance(config, dict):
        raise CheckpointError(f"checkpoint {path} carries no run config in its common state (key 'config'); "
                              "it was not written by cplm_megatron's trainer or tools/convert_from_hf.py")
    return config
