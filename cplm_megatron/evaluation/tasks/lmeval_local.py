"""Local lm-eval tasks: a jsonl of documents + a task YAML including one of the packaged templates.

The templates in ``lm_eval_tasks/`` (package data) fix the prompt format and metrics per task kind;
``write_local_task`` adds the task name and the data file, so that
``lm_eval --include_path TASK_DIR --tasks NAME`` runs offline.
"""

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

TEMPLATE_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
TASK_FIELDS: dict[str, tuple[str, ...]] = {
    "multiple_choice": ("context", "choices", "label"),
    "loglikelihood_rolling": ("text",),
    "generate_until": ("prompt", "target"),
}
_TASK_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


def template_path(kind: str) -> Path:
    """The packaged template YAML for a task kind."""
    if kind not in TASK_FIELDS:
        raise ValueError(f"unknown local task kind {kind!r}; choose one of {sorted(TASK_FIELDS)}")
    return TEMPLATE_DIR / f"_cplm_local_{kind}.yaml"


def write_local_task(
    task_dir: str | Path, name: str, kind: str, docs: Sequence[Mapping[str, object]]
) -> Path:
    """Write `<task_dir>/<name>.jsonl` and `<task_dir>/<name>.yaml` (an lm-eval task); return the YAML path."""
    template = template_path(kind)
    if not _TASK_NAME.match(name):
        raise ValueError(f"task name {name!r} must use only letters, digits, '_' and '-'")
    if not docs:
        raise ValueError(f"local task {name!r}: no documents given")
    required = TASK_FIELDS[kind]
    for index, doc in enumerate(docs):
        missing = [field for field in required if field not in doc]
        if missing:
            raise ValueError(f"local task {name!r}: document {index} lacks fields {missing} (a {kind} "
                             f"document needs {list(required)})")
    out = Path(task_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_path = (out / f"{name}.jsonl").resolve()
    data_path.write_text("".join(json.dumps(dict(doc)) + "\n" for doc in docs))
    task = {
        "include": str(template),
        "task": name,
        "dataset_kwargs": {"data_files": {"train": str(data_path)}},
    }
    yaml_path = out / f"{name}.yaml"
    yaml_path.write_text(yaml.safe_dump(task, sort_keys=False))
    return yaml_path
