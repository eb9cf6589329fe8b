"""Evaluate a Megatron checkpoint or an HF export on the CPLM evaluation tasks (`tools/evaluate.py` in a
checkout, `python -m cplm_megatron.evaluate` or `cplm-evaluate` where the package is installed).

  .venv/bin/python tools/evaluate.py --checkpoint runs/tiny --tasks val,copy,passkey,spamlang,gradient \\
      --output runs/tiny/eval.json
  .venv/bin/python tools/evaluate.py --hf runs/tiny/hf --tasks copy,lm-eval --output eval_hf.json

--checkpoint takes a run dir (its checkpoints/latest), a checkpoints/ dir or one checkpoints/iter_*
dir; --hf an exported directory (tools/convert_to_hf.py). Tasks: val (loss/perplexity on --data or
the run's validation streams, with a 95% interval over documents; 256 sequences spread evenly across the set
unless --limit N, every one with --val-all), copy, passkey, spamlang, gradient, cache (the model + a continuous
cache, Grave et al. 2017, lambda/theta tuned on --dev-data, default the dev/ split beside the validation data),
lm-eval (HF only), or `all` (every task but lm-eval and cache). Writes the results as JSON to --output and prints
a table (and how many validation sequences of how many were scored). Progress bars on stderr (--no-progress);
start-up details with -v; Ctrl-C stops with one line and exit 130, writing nothing.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from cplm_megatron.data.synthetic import COPY_LAYOUTS
from cplm_megatron.entry_points import exit_2_on, quiet_known_warnings, set_verbose
from cplm_megatron.evaluation.options import DEFAULT_LIMITS, EvalOptions
from cplm_megatron.evaluation.runner import (
    evaluate,
    evaluate_checkpoints,
    format_table,
    parse_tasks,
)


def _numbers(kind):
    def parse(text: str):
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="Megatron run dir, checkpoints/ dir or checkpoints/iter_* dir")
    source.add_argument("--hf", help="exported Hugging Face model directory")
    p.add_argument("--tasks", default="all", help="comma-separated: val,copy,passkey,spamlang,gradient,cache,"
                                                  "lm-eval or all (default: all but lm-eval and cache)")
    p.add_argument("--output", required=True, help="results JSON file")
    p.add_argument("--data", help="prepared dataset dir for val (default: the run's data.val_streams)")
    p.add_argument("--dev-data", help="prepared dataset to tune the cache task's lambda/theta on (default: the dev/ "
                                      "beside the validation data)")
    p.add_argument("--val-all", action="store_true", help="val and cache score every validation sample whatever "
                                                          "--limit says (default: a sample spread across the set)")
    p.add_argument("--limit", type=int, help=f"sequences per task (passkey: per cell; val and cache: spread evenly "
                                             f"across the validation set); default {DEFAULT_LIMITS}")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="offset of the synthetic tasks' sample seed")
    p.add_argument("--copy-length", type=int, default=EvalOptions.copy_length)
    p.add_argument("--copy-layout", choices=COPY_LAYOUTS, default=EvalOptions.copy_layout,
                   help="copy samples: half = a span and its repeat (data.synthetic=copy); random = a span of random "
                        "length recurring at a random later offset (data.synthetic=copy_random)")
    p.add_argument("--spamlang-length", type=int, default=EvalOptions.spamlang_length)
    p.add_argument("--passkey-lengths", type=_numbers(int), default=EvalOptions.passkey_lengths,
                   help="context lengths, e.g. 64,128,256")
    p.add_argument("--passkey-depths", type=_numbers(float), default=EvalOptions.passkey_depths,
                   help="needle depths in [0, 1], e.g. 0,0.5,1")
    p.add_argument("--gradient-source", choices=("copy", "spamlang", "val"), default="copy",
                   help="the batch of the gradient task")
    p.add_argument("--lm-eval-tasks", help="lm-eval task names (default: the built-in local tasks)")
    p.add_argument("--lm-eval-include", help="lm-eval --include_path with your own local task YAMLs")
    p.add_argument("--lm-eval-arg", action="append", default=[], help="extra lm_eval argument (repeatable)")
    p.add_argument("--all-checkpoints", action="store_true",
                   help="with --checkpoint RUN_DIR: evaluate every saved checkpoint (metrics vs steps)")
    p.add_argument("--include-initial", action="store_true",
                   help="with --all-checkpoints: also the untrained model (iteration 0, rebuilt from the run's seed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="start-up details: the megatron-core patches, megatron-core's and torch's warnings")
    return p.parse_args(argv)


def options_from_args(args: argparse.Namespace) -> EvalOptions:
    return EvalOptions(
        batch_size=args.batch_size, limit=args.limit, seed=args.seed, data=args.data,
        dev_data=args.dev_data, val_all=args.val_all,
        copy_length=args.copy_length, copy_layout=args.copy_layout, spamlang_length=args.spamlang_length,
        passkey_lengths=tuple(args.passkey_lengths), passkey_depths=tuple(args.passkey_depths),
        gradient_source=args.gradient_source, lm_eval_tasks=args.lm_eval_tasks,
        lm_eval_include=args.lm_eval_include, lm_eval_args=tuple(args.lm_eval_arg),
        show_progress=not args.no_progress,
    )


INTERRUPTED_EXIT_CODE = 130  # Ctrl-C (128 + SIGINT), as every tool


def main(argv: list[str] | None = None) -> int:
    """Evaluate and write the results; bad input is one `error:` line (exit 2), Ctrl-C one line (exit 130)."""
    # Ctrl-C stops it even where it started with SIGINT ignored (in a script's background), as training does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while this line is written changes nothing
        _close_progress_bars()
        print("[evaluate] interrupted (Ctrl-C): nothing written; rerun the command to evaluate", file=sys.stderr,
              flush=True)
        return INTERRUPTED_EXIT_CODE


def _close_progress_bars() -> None:
    """Close the bars an interrupted task left open (on a terminal: their line is cleared for the message)."""
    from tqdm import tqdm

    bars = list(getattr(tqdm, "_instances", ()))
    for bar in bars:
        bar.close()
    if bars:  # a bar below the first (a finished one not yet collected held its row) ends off column 0
        sys.stderr.write("\r")


@exit_2_on(ValueError, FileNotFoundError)
def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.verbose:
        set_verbose()
    quiet_known_warnings()
    tasks = parse_tasks(args.tasks)
    options = options_from_args(args)
    options.validate()
    if args.all_checkpoints and not args.checkpoint:
        raise ValueError("--all-checkpoints needs --checkpoint RUN_DIR")
    output = Path(args.output)
    check_output(output)  # before the evaluation, not after it
    results = run(args, tasks, options)
    from cplm_megatron.durable_files import write_atomic
    from cplm_megatron.evaluation.results import with_version

    write_atomic(output, json.dumps(with_version(results), indent=2) + "\n")  # whole or not at all
    for entry in results.get("checkpoints", [results]):
        print(format_table(entry) + "\n")
    print(f"results: {output}")
    return 0


def check_output(output: Path) -> None:
    """--output can be written (its directory is created if missing): a ValueError naming the path otherwise."""
    import tempfile

    if output.is_dir():
        raise ValueError(f"--output {output} is a directory; name the results file, e.g. {output / 'eval.json'}")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output.parent, prefix=".cplm-write-test-"):
            pass
    except OSError as e:
        raise ValueError(f"--output {output} cannot be written ({e.strerror or e}); choose a writable place") from None


def _load_hf(path: str):
    """HFScorer.load, with weights cut short (an interrupted download or copy) as one ValueError naming them."""
    from safetensors import SafetensorError

    from cplm_megatron.evaluation.scorers import HFScorer

    try:
        return HFScorer.load(path)
    except SafetensorError as err:
        raise ValueError(f"--hf {path}: a weight file is not a complete safetensors file ({err}): it is truncated "
                         f"or damaged (an interrupted export, download or copy?); export or copy it again") from None


def run(args: argparse.Namespace, tasks: list[str], options: EvalOptions) -> dict[str, Any]:
    """The results of one model, or of every checkpoint of a run (--all-checkpoints)."""
    from cplm_megatron.evaluation.scorers import MegatronScorer, cp_note, single_process_megatron

    if args.hf and not args.all_checkpoints:
        return evaluate(_load_hf(args.hf), tasks, options)
    from cplm_megatron.checkpoint.lookup import read_live
    from cplm_megatron.parallel.megatron_patches import setup_compat

    setup_compat()  # a Megatron model from here on
    if args.all_checkpoints:
        return evaluate_checkpoints(args.checkpoint, tasks, options, include_initial=args.include_initial)

    with single_process_megatron():
        # a run still training may prune the checkpoint while it loads: then the newest complete one is used
        scorer = read_live(Path(args.checkpoint), lambda ref: MegatronScorer.load(ref.path), say=_say)
        note = cp_note(scorer)
        if note:
            _say(note)
        return evaluate(scorer, tasks, options)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
