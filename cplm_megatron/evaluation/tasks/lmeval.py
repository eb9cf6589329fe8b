"""`lm-eval`: lm-evaluation-harness on an HF export, with local task files (offline).

Runs `python -m lm_eval --model hf` in a subprocess on the export directory. Without
`lm_eval_include`, writes two built-in text tasks (tokenizer-agnostic, made of common words) and
runs them: `cplm_copy_words` (multiple choice: continue a repeated word list) and
`cplm_passkey_lines` (greedy generation: recall a number shown earlier in a `key:` line).
"""
from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
from cplm_megatron.evaluation.tasks.base import TaskResult

BUILTIN_TASKS = ("cplm_copy_words", "cplm_passkey_lines")
DEFAULT_DOCS = 32
WORDS = ("apple", "river", "stone", "cloud", "table", "window", "garden", "silver", "orange", "candle", "bridge",
         "forest", "paper", "music", "winter", "yellow", "rocket", "planet", "coffee", "mirror", "button",
         "pencil", "ladder", "shadow", "butter", "castle", "dragon", "engine", "feather", "harbor", "island",
         "jacket", "kettle", "lemon", "marble", "needle", "ocean", "pepper", "quarter", "saddle")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def copy_words_docs(n: int, seed: int, span: int = 6) -> list[dict]:
    """Multiple choice: `w1 .. wk. w1 .. w(k-1)` continued by wk (vs two other words of the list)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        words = rng.sample(WORDS, span + 2)
        shown, distractors = words[:span], words[span:]
        choices = [shown[-1]] + distractors
        rng.shuffle(choices)
        docs.append({"context": " ".join(shown) + ". " + " ".join(shown[:-1]), "choices": choices,
                     "label": choices.index(shown[-1])})
    return docs


def passkey_lines_docs(n: int, seed: int, filler_lines: int = 6) -> list[dict]:
    """Greedy generation: `key: NNNNN` among filler lines, then `key:` -> ` NNNNN`."""
    rng = random.Random(seed + 1)
    docs = []
    for _ in range(n):
        key = str(rng.randrange(10_000, 100_000))
        lines = [" ".join(rng.sample(WORDS, 5)) for _ in range(filler_lines)]
        lines.insert(rng.randrange(filler_lines + 1), f"key: {key}")
        docs.append({"prompt": "\n".join(lines) + "\nkey:", "target": f" {key}"})
    return docs


def write_builtin_tasks(task_dir: Path, n: int, seed: int) -> list[str]:
    """Write the built-in local tasks into `task_dir`; their names."""
    from cplm_megatron.evaluation.tasks.lmeval_local import write_local_task

    write_local_task(task_dir, "cplm_copy_words", "multiple_choice", copy_words_docs(n, seed))
    write_local_task(task_dir, "cplm_passkey_lines", "generate_until", passkey_lines_docs(n, seed))
    return list(BUILTIN_TASKS)


def offline_env(hf_home: Path | None = None) -> dict[str, str]:
    """The environment of the lm-eval process: no hub access; remote code cached under hf_home."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    return env


def lm_eval_command(model_dir: Path, include: Path, tasks: list[str], output: Path, batch_size: int,
                    limit: int | None, extra: list[str]) -> list[str]:
    """The lm_eval command line (hf backend, trust_remote_code, fp32 on CPU unless `extra` says otherwise)."""
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf",
           "--model_args", f"pretrained={model_dir},trust_remote_code=True,dtype=float32",
           "--include_path", str(include), "--tasks", ",".join(tasks), "--device", "cpu",
           "--batch_size", str(batch_size), "--output_path", str(output)]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    return cmd + list(extra)


def read_results(output: Path) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} from lm-eval's results_*.json under `output` (stderr entries dropped)."""
    files = sorted(output.rglob("results_*.json"))
    if not files:
        raise RuntimeError(f"lm-eval wrote no results_*.json under {output}")
    results = json.loads(files[-1].read_text())["results"]
    table: dict[str, dict[str, float]] = {}
    for task, values in results.items():
        table[task] = {key.split(",")[0]: float(v) for key, v in values.items()
                       if isinstance(v, (int, float)) and "stderr" not in key}
    return table


def run_lm_eval(cmd: list[str], env: dict[str, str], show_progress: bool) -> None:
    """Run lm-eval, echoing its output to stderr when `show_progress`; raise with the output's tail on failure."""
    tail: collections.deque = collections.deque(maxlen=60)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            tail.append(line)
            if show_progress:
                sys.stderr.write(line)
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"lm-eval failed (exit {code}): {' '.join(cmd)}\n{''.join(tail)}")


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    if scorer.backend != "hf":
        raise ValueError("task lm-eval runs on HF exports: convert the checkpoint with tools/convert_to_hf.py "
                         "(with --tokenizer) and evaluate it with --hf DIR")
    if not any((scorer.directory / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"task lm-eval needs a tokenizer in {scorer.directory} (none of {TOKENIZER_FILES}); "
                                f"export with tools/convert_to_hf.py --tokenizer DIR")
    with tempfile.TemporaryDirectory(prefix="cplm-lm-eval-") as tmp:
        tmp_path = Path(tmp)
        if options.lm_eval_include:
            include = Path(options.lm_eval_include)
            if not options.lm_eval_tasks:
                raise ValueError("with lm_eval_include, name the tasks to run (--lm-eval-tasks a,b)")
            tasks = options.lm_eval_tasks.split(",")
        else:
            include = tmp_path / "tasks"
            n = options.limit or DEFAULT_DOCS
            tasks = write_builtin_tasks(include, n, options.eval_seed)
            if options.lm_eval_tasks:
                tasks = options.lm_eval_tasks.split(",")
        cmd = lm_eval_command(scorer.directory, include, tasks, tmp_path / "out", options.batch_size,
                              options.limit, list(options.lm_eval_args))
        run_lm_eval(cmd, offline_env(tmp_path / "hf_home"), options.show_progress)
        table = read_results(tmp_path / "out")
    metrics = {f"{task}/{metric}": value for task, values in table.items() for metric, value in values.items()}
    source = options.lm_eval_include or "built-in local tasks"
    return TaskResult("lm-eval", metrics, {"tasks": tasks, "include_path": source, "results": table})
