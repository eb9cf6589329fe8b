"""Long-context evaluation: passkey retrieval (first key token) and copy accuracy by context length for a tiny
baseline and a tiny CPLM trained with context parallelism at one length, scored at that length and beyond.

  taskset -c 0 .venv/bin/python -m benchmarks.long_context            # CP=2 at 8k, scored at 4k/8k/16k/32k

Training has two phases, as long-context models are usually made: --short-iters steps at --short-seq-len in
one process (where copying is learned at a CPU's budget: from scratch at 8k neither model left chance in 120
steps), then --iters steps at --seq-len with parallel.cp=--cp from the short phase's weights
(checkpoint.load, load_optimizer=false; RoPE: the same weights serve every length). --short-iters 0 trains
at --seq-len from scratch.

Each model is the tiny recipe (configs/tiny.yaml: Llama-style, RoPE) at vocabulary --vocab on synthetic
`COPY_TASK+passkey` data (even samples copy, odd ones a passkey sample with the needle at an even spread of
depths; data/synthetic.py). --copy-task copy_random (the default): a span of random length recurs at a random
later offset inside random tokens, so where to copy from must be found by content; copy: a span and its repeat
at seq_len/2, which a model learns by position (and which then fails at any other length). Trained by
pretrain/pretrain_cplm.py under torchrun with parallel.cp=--cp, model.max_position_embeddings the longest scored
length (RoPE: no parameters to grow), plain causal attention. Both are then scored in this process at CP=1
(evaluation/scorers.py) by cplm_megatron.evaluation.long_context at every --lengths: copy accuracy on samples of
the training copy task's layout (chance 1/(V-1); beside it a copier matching the current token alone, on the same
samples) and passkey first-token accuracy over --depths (chance 1/(V-3)). Runs live in RUNS/COPY_TASK/MODEL[-short];
a run whose last checkpoint is at its phase's steps is not trained again (its training time is read back from the
run dir's bench_timing.json, which counts every attempt, a killed one up to its last 5-second tick); an interrupted
one resumes. Each phase's settings are recorded in its run dir (bench_settings.json: the trainer's overrides and the
recipe's checksum) and a run dir is reused only with the same settings: another --vocab, --lr, --global-batch, ...
is refused with one line naming what differs (exit 2). SIGTERM or Ctrl-C stops the running phase with a checkpoint
(exit 75), and torchrun is stopped with this process however it ends. Writes OUT/NAME.json (settings, command,
per-run training time and evaluation by length) and OUT/NAME.png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[3]  # the checkout: pretrain/, configs/, runs/, results/

PRETRAIN = REPO / "pretrain" / "pretrain_cplm.py"
RECIPE = REPO / "configs" / "tiny.yaml"
MODELS = {"baseline": False, "cplm": True}
COPY_TASKS = {"copy_random": "random", "copy": "half"}  # training task -> its evaluation layout
TIMING = "bench_timing.json"  # a phase's training seconds and CPU seconds, summed over every attempt
SETTINGS = "bench_settings.json"  # the settings a phase's run dir was trained with (its reuse needs the same)
TICK_S = 5.0  # how often a running phase's seconds are written (a killed attempt keeps its time up to the last)


class SettingsDiffer(Exception):
    """A run dir trained with other settings than this invocation's (the one line to print, exit 2)."""


class Stopped(Exception):
    """A phase stopped by SIGTERM or Ctrl-C with a checkpoint (the one line to print, exit 75)."""


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> List[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "long_context", help="run directories (one per model)")
    p.add_argument("--out", type=Path, default=REPO / "results" / "long_context")
    p.add_argument("--name", default="long_context_cpu", help="file name of the JSON and the plot")
    p.add_argument("--seq-len", type=int, default=8192, help="training sequence length of the long phase")
    p.add_argument("--cp", type=int, default=2, help="context-parallel size of the long phase (processes)")
    p.add_argument("--iters", type=int, default=30, help="steps of the long phase")
    p.add_argument("--global-batch", type=int, default=2, help="sequences per step of the long phase (micro-batch 1)")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate of the long phase")
    p.add_argument("--short-seq-len", type=int, default=256, help="sequence length of the short phase")
    p.add_argument("--short-iters", type=int, default=600, help="steps of the short phase (0: none)")
    p.add_argument("--short-global-batch", type=int, default=16, help="sequences per step of the short phase")
    p.add_argument("--short-lr", type=float, default=2e-3, help="peak learning rate of the short phase")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--copy-task", choices=COPY_TASKS, default="copy_random",
                   help="the copy half of the training data, and the layout of the scored copy samples")
    p.add_argument("--lengths", type=_ints, default=[4096, 8192, 16384, 32768], help="scored context lengths")
    p.add_argument("--depths", type=_floats, default=[0.0, 0.5, 1.0], help="passkey needle depths")
    p.add_argument("--samples", type=int, default=4, help="copy sequences and passkey samples per depth, per length")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--phase-lengths", type=_ints, default=[], metavar="L,...",
                   help="also score each model's earlier phases (the short phase) at these lengths: where what they "
                        "learned stops working")
    args = p.parse_args(argv)
    if args.seq_len % (2 * args.cp) or args.global_batch < 1 or args.iters < 2 or args.samples < 1 \
            or args.short_iters < 0 or args.short_iters == 1 or args.short_seq_len < 2 or args.short_global_batch < 1:
        p.error(f"need --seq-len divisible by 2 x --cp ({2 * args.cp}), --global-batch >= 1, --iters >= 2, "
                f"--samples >= 1, --short-iters 0 or >= 2, --short-seq-len >= 2, --short-global-batch >= 1")
    return args


@dataclass(frozen=True)
class Phase:
    """One training phase of a model: its length, layout, batch, steps and where it starts from."""

    name: str  # "short" | "long"
    seq_len: int
    cp: int
    global_batch: int
    micro_batch: int
    iters: int
    lr: float
    load: Optional[Path] = None  # weights to start from (the short phase's run dir)


def phases(args: argparse.Namespace, name: str) -> List[Tuple[Phase, Path]]:
    """The phases of one model's training and their run directories (the long one last: it is scored)."""
    long_dir = args.runs / args.copy_task / name
    if not args.short_iters:
        return [(Phase("long", args.seq_len, args.cp, args.global_batch, 1, args.iters, args.lr), long_dir)]
    short_dir = args.runs / args.copy_task / f"{name}-short"
    return [(Phase("short", args.short_seq_len, 1, args.short_global_batch, args.short_global_batch,
                   args.short_iters, args.short_lr), short_dir),
            (Phase("long", args.seq_len, args.cp, args.global_batch, 1, args.iters, args.lr, load=short_dir),
             long_dir)]


def train_overrides(args: argparse.Namespace, phase: Phase, run_dir: Path, copy_head: bool) -> List[str]:
    """The recipe overrides of one model's phase (the same for both models but the copy head)."""
    sets = {
        "run.dir": run_dir, "copy_head.enabled": str(copy_head).lower(), "model.vocab_size": args.vocab,
        "model.max_position_embeddings": max([args.seq_len, *args.lengths]), "data.synthetic": f"{args.copy_task}+passkey",
        "data.document_masking": "false", "parallel.cp": phase.cp, "train.seq_len": phase.seq_len,
        "train.micro_batch": phase.micro_batch, "train.global_batch": phase.global_batch, "train.iters": phase.iters,
        "train.lr": phase.lr, "train.min_lr": phase.lr / 10, "train.log_interval": max(1, phase.iters // 50),
        "train.eval_interval": 0, "schedule.warmup_iters": max(1, min(20, phase.iters // 10)),
        "checkpoint.interval": max(1, phase.iters // 5), "checkpoint.keep": 1, "logging.wandb": "false",
    }
    if phase.load is not None:
        sets.update({"checkpoint.load": phase.load, "checkpoint.load_optimizer": "false"})
    return [f"{k}={v}" for k, v in sets.items()]


def train_command(args: argparse.Namespace, phase: Phase, run_dir: Path, copy_head: bool) -> List[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={phase.cp}"]
    return [*launcher, str(PRETRAIN), "--config", str(RECIPE), "--set",
            *train_overrides(args, phase, run_dir, copy_head)]


def portable(cmd: List[str]) -> str:
    """A command line as recorded in the results: `python` for this interpreter, paths inside the checkout relative."""
    def arg(a: str) -> str:
        if a == sys.executable:
            return "python"
        head, sep, tail = a.partition("=") if a.startswith(("run.dir=", "checkpoint.load=")) else ("", "", a)
        path = Path(tail)
        if path.is_absolute() and path.is_relative_to(REPO):
            tail = str(path.relative_to(REPO))
        return head + sep + tail
    return " ".join(arg(a) for a in cmd)


def _last_iteration(run_dir: Path) -> int:
    from cplm_megatron.checkpoint.lookup import CheckpointError, resolve_checkpoint

    if not (run_dir / "checkpoints").is_dir():
        return 0
    try:
        return resolve_checkpoint(run_dir, say=lambda _message: None).iteration
    except CheckpointError:
        return 0


def _losses(run_dir: Path) -> Dict[int, float]:
    from cplm_megatron.training.metrics_log import read_metrics, record_nll

    # the NLL, whichever version logged it; a line cut by an interrupted write is left out
    return {r["iteration"]: record_nll(r) for r in read_metrics(run_dir) if "loss" in r}


def _tail(run_dir: Path, lines: int = 15) -> str:
    """The last lines of a phase's train.log."""
    return "\n".join((run_dir / "train.log").read_text(errors="replace").splitlines()[-lines:])


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (torchrun and its workers) so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timing(run_dir: Path) -> Optional[Dict[str, float]]:
    """The run dir's training time totals (None: never trained by this script since timing was kept)."""
    path = run_dir / TIMING
    if not path.is_file():
        return None
    try:
        timing = json.loads(path.read_text())
        return {k: float(timing[k]) for k in ("train_seconds", "train_cpu_seconds")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SettingsDiffer(f"{path} is not a readable timing record ({type(e).__name__}: {e}); remove it (the "
                             f"phase's time is then counted from its next attempt) or restore it") from None


def _add_timing(run_dir: Path, seconds: float, cpu_seconds: float, base: Optional[Dict[str, float]] = None
                ) -> Dict[str, float]:
    """The run dir's totals (`base`: as before this attempt) plus this attempt's time, written; returns them."""
    from cplm_megatron.durable_files import write_atomic

    total = base or {"train_seconds": 0.0, "train_cpu_seconds": 0.0}
    total = {"train_seconds": round(total["train_seconds"] + seconds, 1),
             "train_cpu_seconds": round(total["train_cpu_seconds"] + cpu_seconds, 1)}
    write_atomic(run_dir / TIMING, json.dumps(total) + "\n")
    return total


def phase_settings(args: argparse.Namespace, phase: Phase, run_dir: Path, copy_head: bool) -> Dict[str, str]:
    """What a phase's run dir is trained with: the trainer's overrides but run.dir (checkpoint.load relative to the
    run dir, so a moved --runs keeps its runs) and the recipe's checksum."""
    import hashlib

    sets = dict(o.split("=", 1) for o in train_overrides(args, phase, run_dir, copy_head))
    sets.pop("run.dir")
    if "checkpoint.load" in sets:
        sets["checkpoint.load"] = os.path.relpath(sets["checkpoint.load"], run_dir)
    return {**sets, "recipe_sha256": hashlib.sha256(RECIPE.read_bytes()).hexdigest()}


def _same(saved: Any, wanted: str) -> bool:
    try:
        return float(saved) == float(wanted)
    except (TypeError, ValueError):
        return str(saved).lower() == str(wanted).lower()


def _saved_settings(run_dir: Path, wanted: Dict[str, str]) -> Optional[Dict[str, Any]]:
    """The settings `run_dir` was trained with (None: a new run dir). A run dir trained before the settings were
    recorded answers through its config.yaml (the recipe and the load path are then taken as they are now)."""
    import yaml

    record = run_dir / SETTINGS
    if record.is_file():
        try:
            return dict(json.loads(record.read_text())["settings"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SettingsDiffer(f"{record} is unreadable ({type(e).__name__}: {e}): remove {run_dir} to retrain "
                                 f"that run, or restore the file") from None
    if not (run_dir / "config.yaml").is_file():
        return None
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}

    def dotted(key: str) -> Any:
        value: Any = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return {k: (wanted[k] if k in ("recipe_sha256", "checkpoint.load") else dotted(k)) for k in wanted}


def check_settings(run_dir: Path, wanted: Dict[str, str]) -> None:
    """SettingsDiffer unless `run_dir` is new or was trained with `wanted`; records them (bench_settings.json)."""
    saved = _saved_settings(run_dir, wanted)
    if saved is None:
        return
    differ = [f"{k}: {saved.get(k)} -> {v}" for k, v in wanted.items() if not _same(saved.get(k), v)]
    if differ:
        raise SettingsDiffer(f"{run_dir} holds a run trained with other settings ({'; '.join(differ)}): its results "
                             f"would be reported under this invocation's settings; remove it to retrain, or pass "
                             f"another --runs directory")
    if not (run_dir / SETTINGS).is_file():
        (run_dir / SETTINGS).write_text(json.dumps({"settings": wanted}, indent=2) + "\n")


def _stop_with_parent() -> None:
    """In torchrun's process, before it starts: SIGTERM when this script's process dies (PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))


def _run_torchrun(cmd: List[str], log_path: Path, run_dir: Path, base: Optional[Dict[str, float]]) -> int:
    """torchrun `cmd` with its output appended to `log_path`; its seconds are added to the run dir's totals every
    TICK_S (a killed attempt keeps its time) and at the end; SIGTERM or Ctrl-C to this process stops torchrun (its
    workers checkpoint: exit 75); torchrun gets SIGTERM when this process dies, however (kill -9 included)."""
    import signal
    import threading

    start, cpu = time.perf_counter(), _children_cpu()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_stop_with_parent)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(TICK_S):
            _add_timing(run_dir, time.perf_counter() - start, 0.0, base)

    previous = {sig: signal.signal(sig, lambda signum, frame: proc.send_signal(signal.SIGTERM))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    threading.Thread(target=tick, daemon=True).start()
    try:
        return proc.wait()
    finally:
        done.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # every training process's CPU time (children of this process: torchrun and its workers)
        _add_timing(run_dir, time.perf_counter() - start, _children_cpu() - cpu, base)


def train_phase(args: argparse.Namespace, name: str, copy_head: bool, phase: Phase, run_dir: Path,
                train: bool = True) -> Dict[str, Any]:
    """Train (or finish) one phase of one model; its directory, training time (every attempt) and losses.
    `train` False: FileNotFoundError where the phase has not finished."""
    totals = _timing(run_dir)
    wanted = phase_settings(args, phase, run_dir, copy_head)
    check_settings(run_dir, wanted)
    if _last_iteration(run_dir) < phase.iters and not train:
        raise FileNotFoundError(f"{run_dir}: {name}'s {phase.name} phase has not finished (iteration "
                                f"{_last_iteration(run_dir)} of {phase.iters}); run without --report-only")
    if _last_iteration(run_dir) < phase.iters:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / SETTINGS).is_file():
            (run_dir / SETTINGS).write_text(json.dumps({"settings": wanted}, indent=2) + "\n")
        cmd = train_command(args, phase, run_dir, copy_head)
        print(f"[long_context] training {name} ({phase.name} phase: {phase.iters} steps at {phase.seq_len} tokens, "
              f"cp={phase.cp}); log {run_dir / 'train.log'}", flush=True)
        code = _run_torchrun(cmd, run_dir / "train.log", run_dir, totals)
        if code != 0 and _last_iteration(run_dir) < phase.iters and "exit code 75 = resume me" in _tail(run_dir):
            raise Stopped(f"[long_context] {name} ({phase.name} phase) stopped at iteration "
                          f"{_last_iteration(run_dir)} with a checkpoint; run the same command again to continue")
        if code != 0:
            raise SystemExit(f"training {name} ({phase.name} phase) failed (exit {code}); {run_dir / 'train.log'} "
                             f"ends:\n" + _tail(run_dir))
        totals = _timing(run_dir)
    losses = _losses(run_dir)
    return {"phase": phase.name, "run_dir": str(run_dir), "seq_len": phase.seq_len, "cp": phase.cp,
            **(totals or {"train_seconds": None, "train_cpu_seconds": None}),  # None: trained before timing was kept
            "iterations": _last_iteration(run_dir), "first_loss": losses.get(min(losses)) if losses else None,
            "final_loss": losses.get(max(losses)) if losses else None,
            "command": portable(train_command(args, phase, run_dir, copy_head))}


def train(args: argparse.Namespace, name: str, copy_head: bool, train: bool = True) -> Dict[str, Any]:
    """Every phase of one model; the long (last, scored) phase's figures at the top, all phases under 'phases'."""
    done = [train_phase(args, name, copy_head, phase, run_dir, train) for phase, run_dir in phases(args, name)]
    return {**{k: v for k, v in done[-1].items() if k not in ("phase", "command")}, "phases": done}


def evaluate(args: argparse.Namespace, runs: Dict[str, Dict[str, Any]]) -> None:
    """Every model by length, in this process at CP=1; adds the results to `runs`."""
    from cplm_megatron.evaluation.long_context import evaluate_by_length
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron
    from cplm_megatron.parallel.megatron_patches import setup_compat

    setup_compat()
    options = EvalOptions(batch_size=args.batch_size, limit=args.samples, passkey_depths=tuple(args.depths),
                          copy_layout=COPY_TASKS[args.copy_task], show_progress=False)
    with single_process_megatron():
        for run in runs.values():
            start = time.perf_counter()
            run.update(evaluate_by_length(MegatronScorer.load(run["run_dir"]), args.lengths, options))
            run["eval_seconds"] = round(time.perf_counter() - start, 1)
            run["eval_cpu_seconds"] = round(sum(row["cpu_seconds"] for row in run["by_length"]), 1)
            for phase in run["phases"][:-1] if args.phase_lengths else []:
                phase["by_length"] = evaluate_by_length(MegatronScorer.load(phase["run_dir"]), args.phase_lengths,
                                                        options)["by_length"]


def plot(report: Dict[str, Any], path: Path) -> None:
    """Passkey first-token and copy accuracy against context length, both models, chance dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = (("passkey_first_token_accuracy", "passkey: first key token"),
              ("copy_accuracy", f"copy ({report['settings']['copy_task']}): repeat"))
    trained = report["settings"]["seq_len"]
    for ax, (key, title) in zip(axes, panels):
        for name, run in report["runs"].items():
            rows = run["by_length"]
            ax.plot([r["length"] for r in rows], [r[key] for r in rows], marker="o", label=name)
        first = next(iter(report["runs"].values()))
        chance = first["chance"][key]
        ax.axhline(chance, color="gray", linestyle="--", linewidth=1, label=f"chance {chance:.2g}")
        if key == "copy_accuracy":  # the same samples for every model
            rows = first["by_length"]
            ax.plot([r["length"] for r in rows], [r["copy_accuracy_one_token_match"] for r in rows], color="gray",
                    linestyle=":", marker=".", label="one-token match (no model)")
        ax.axvline(trained, color="gray", linestyle=":", linewidth=1, label=f"trained at {trained}")
        ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel="context length (tokens)", ylabel="accuracy", ylim=(-0.02, 1.02))
        ax.legend(fontsize=8)
    s = report["settings"]
    short = f"{s['short_iters']} steps at {s['short_seq_len']}, then " if s["short_iters"] else ""
    fig.suptitle(f"tiny models: {short}{s['iters']} steps at {trained} with CP={s['cp']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_comparison(args: argparse.Namespace, command: str, train_runs: bool = True) -> Path:
    """Train what has not finished (`train_runs` False: FileNotFoundError naming it), score every model by length,
    write OUT/NAME.json and OUT/NAME.png and print the table; SettingsDiffer or Stopped as train_phase raises them."""
    import torch

    from cplm_megatron.entry_points import quiet_known_warnings

    quiet_known_warnings()
    runs = {name: train(args, name, copy_head, train_runs) for name, copy_head in MODELS.items()}
    evaluate(args, runs)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = {
        "benchmark": "long_context",
        "command": command,
        "settings": settings,
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
                        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None},
        "train_commands": {name: " && ".join(phase["command"] for phase in run["phases"]) for name, run in runs.items()},
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / f"{args.name}.png")
    print_table(runs)
    print(f"results: {args.out / (args.name + '.json')}, {args.out / (args.name + '.png')}")
    return args.out / f"{args.name}.json"


def print_table(runs: Dict[str, Dict[str, Any]]) -> None:
    """Passkey and copy accuracy by length, every model side by side; then each earlier phase scored."""
    for length_rows in zip(*(run["by_length"] for run in runs.values())):
        cells = "  ".join(f"{name}: passkey@1 {row['passkey_first_token_accuracy']:.3f} copy {row['copy_accuracy']:.3f}"
                          for name, row in zip(runs, length_rows))
        print(f"length {length_rows[0]['length']:>6}  {cells}  "
              f"(one-token match {length_rows[0]['copy_accuracy_one_token_match']:.3f})")
    for name, run in runs.items():
        for phase in run["phases"]:
            for row in phase.get("by_length", []):
                print(f"{name} {phase['phase']} phase, length {row['length']:>6}: passkey@1 "
                      f"{row['passkey_first_token_accuracy']:.3f} copy {row['copy_accuracy']:.3f} "
                      f"(one-token match {row['copy_accuracy_one_token_match']:.3f})")


def main(argv: Optional[List[str]] = None) -> int:
    """benchmarks/long_context.py: settings that differ from a run dir's are one line and exit 2, a stopped phase one
    line and exit 75."""
    args = parse_args(argv)
    command = portable([sys.executable, "-m", "benchmarks.long_context", *(sys.argv[1:] if argv is None else argv)])
    try:
        run_comparison(args, command)
    except SettingsDiffer as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except Stopped as e:
        print(e, file=sys.stderr, flush=True)
        return 75
    return 0

if __name__ == "__main__":
    sys.exit(main())
