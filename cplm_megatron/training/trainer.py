"""The training loop: build, resume, step, log, evaluate, checkpoint, stop on signals.

Exit codes: 0 finished; RESUME_EXIT_CODE (75) stopped early with a checkpoint (signal or
train.exit_after_iters) — launchers requeue on it; 1 failure (e.g. too many non-finite steps).
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
from cplm_megatron.checkpoint.lookup import layout_text
from cplm_megatron.model.builder import Vocabulary
from cplm_megatron.model.sizing.accounting import CopyHeadShape, train_flops_figures
from cplm_megatron.run_config import RunConfig, dump_run_config
from cplm_megatron.training.callbacks import Callback
from cplm_megatron.training.metrics_log import MetricsLogger, format_line, objective_terms, rank0_print
from cplm_megatron.training.preflight import GIB, checkpoint_size, memory_needed
from cplm_megatron.training.profiling import StepProfiler
from cplm_megatron.training.resume import StartPlan, apply_plan, plan_start
from cplm_megatron.training.signals import RESUME_EXIT_CODE, StopSignal
from cplm_megatron.training.step import eval_step, setup_model_config, take, train_step
from cplm_megatron.training.step_policies import Cadence, NonFiniteGuard, NonFiniteLossError, StopPolicy  # noqa: F401
from cplm_megatron.training.throughput import SpeedMonitor, default_peak_tflops


def copy_shape(cfg: RunConfig) -> Optional[CopyHeadShape]:
    """The copy head's size parameters, or None for the baseline."""
    return CopyHeadShape.of(cfg.copy_head)


def build_data(cfg: RunConfig, vocab: Vocabulary, dp_rank: int, dp_size: int):
    """(training micro-batch iterator, validation loader or None) for this DP rank; `vocab`: what the model was
    built for (build_run): synthetic ids below its size, a dataset's tokenizer checked against its rows."""
    from cplm_megatron.errors import ConfigError

    if cfg.data.synthetic:
        from cplm_megatron.data.synthetic import SyntheticLoader, synthetic_val_batches

        d, t = cfg.data, cfg.train
        train = SyntheticLoader(d.synthetic, t.seq_len, vocab.size, t.micro_batch, dp_rank, dp_size, d.seed)
        val = synthetic_val_batches(d.synthetic, t.eval_iters, t.micro_batch, t.seq_len, vocab.size,
                                    dp_rank, dp_size) if t.eval_interval else None
        return train, val
    if not cfg.data.streams:
        raise ConfigError("data.streams is empty: point it at prepared datasets (e.g. --set "
                          "data.streams=data/stdlib/train after `make data`) or set data.synthetic")
    from cplm_megatron.data.loader import build_train_loader, build_val_loader  # imports streaming
    from cplm_megatron.data.stop import set_stop_check
    from cplm_megatron.training.signals import stop_received

    set_stop_check(stop_received)  # a stop signal ends a wait for the machine's dataset lock
    train = build_train_loader(cfg.data, cfg.train.shape, dp_rank, dp_size, model_vocab_size=vocab.padded)
    val = None
    if cfg.train.eval_interval and cfg.data.val_streams:
        val = build_val_loader(cfg.data, cfg.train.shape, dp_rank, dp_size, model_vocab_size=vocab.padded)
    return train, val


class Trainer:
    """Owns the model chunks, optimizer, data and bookkeeping of one run (one per process)."""

    def __init__(self, cfg: RunConfig, callbacks: Sequence[Callback] = ()):
        self.cfg = self.given = cfg  # given: the settings as written (config.yaml), e.g. model.lm_head_loss=auto
        self.callbacks = list(callbacks)
        self.run_dir = Path(cfg.run.dir)
        self.stop = StopSignal()  # first: a signal during set-up is acted on at the first step boundary
        self.run_lock = None
        try:
            self._build(cfg)
        except BaseException:
            self.stop.restore()
            self._release_lock()
            raise

    def _take_lock(self) -> None:
        """Rank 0 takes RUN_DIR/run.lock (one run per run dir); every rank refuses if it is held by a live run."""
        import torch.distributed as dist

        from cplm_megatron.errors import ConfigError
        from cplm_megatron.training.run_lock import RunLock

        outcome = [None]
        if self.layout.rank == 0:
            self.run_lock = RunLock(self.run_dir)
            try:
                note = self.run_lock.acquire()
                outcome = [("ok", note)]
            except ConfigError as e:
                self.run_lock = None
                outcome = [("refused", str(e))]
        dist.broadcast_object_list(outcome, src=0)
        status, text = outcome[0]
        if status == "refused":
            raise ConfigError(text)
        if text:
            rank0_print(text)

    def _release_lock(self) -> None:
        if self.run_lock is not None:
            self.run_lock.release()
            self.run_lock = None

    def _build(self, cfg: RunConfig) -> None:
        """Every check first (config vs world, resume plan, machine, model, data, the checkpoint's data
        position), then the first write to run.dir (checkpoint.overwrite's delete, a rollback's set-aside,
        config.yaml): a refused launch leaves run.dir as it was."""
        from cplm_megatron.model.builder import build_run, use_te_spec
        from cplm_megatron.model.copy_head import resolve_impl
        from cplm_megatron.model.layout import init_distributed
        from cplm_megatron.parallel.distributed import detect_env
        from cplm_megatron.training.optimizer import build_optimizer, build_scheduler, wrap_ddp
        from cplm_megatron.training.preflight import preflight, range_notes

        # The checks that need no process group run before one exists: a refusal costs no rendezvous.
        env = detect_env()
        dp = cfg.validate_world(env.world_size)
        cfg, note = resolve_lm_head_loss(cfg, dp, env.local_world_size)
        self.cfg = cfg  # the run as it trains: the record, the checkpoints and the hash name the path in use
        if note:
            rank0_print(note, rank=env.rank)
        use_te_spec(cfg.model, cfg.precision)
        if cfg.copy_head.enabled:  # the copy kernel's needs (triton, a device, its head dims), as the head runs
            resolve_impl(cfg.copy_head, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        plan = plan_start(cfg)
        reclaimed = _tree_bytes(self.run_dir / "checkpoints") if plan.delete_existing else 0.0
        preflight(cfg, dp, env.local_world_size, reclaimed)
        self.layout = init_distributed(cfg.parallel, cfg.model, cfg.run.seed, env)
        self._take_lock()  # before anything is written to run.dir
        self.is_logger = self.layout.rank == 0
        self.total_iters = cfg.train.total_iters()
        if torch.cuda.is_available():  # this run's peak, also where one process trains several runs
            torch.cuda.reset_peak_memory_stats()
        self.built = build_run(cfg, self.layout)
        self.chunks = wrap_ddp(self.built.chunks, cfg.optimizer, bf16=cfg.precision.dtype == "bf16")
        t = cfg.train
        self.optimizer = build_optimizer(self.chunks, cfg.optimizer, cfg.precision.dtype, t.lr, t.min_lr)
        self.scheduler = build_scheduler(self.optimizer, cfg.optimizer, cfg.schedule, self.total_iters, t.lr, t.min_lr)
        setup_model_config(self.chunks, self.optimizer)
        self.train_data, self.val_data = build_data(cfg, self.built.vocab, self.layout.dp_rank, self.layout.dp)
        self.num_micro = cfg.train.shape.num_microbatches(self.layout.dp)
        resumed_from = plan.checkpoint.iteration if plan.resumed else None
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", cfg.checkpoint.keep,
                                         cfg.checkpoint.async_save, log=rank0_print, resumed_from=resumed_from,
                                         checkpoint_size=checkpoint_size(cfg))
        self.state = TrainState()
        self._load(plan)  # the data loader refuses a position that does not fit its streams: still nothing written
        for line in range_notes(cfg, self.state.iteration):  # the cadences this launch never reaches
            rank0_print(line)
        # The first step's micro-batches are read now, before run.dir is written: a shard that cannot be read
        # (corrupt with data.verify_shards=false, a full /dev/shm at the epoch's start) leaves nothing behind.
        self._first_batches = take(self.train_data, self.num_micro) if self.state.iteration < self.total_iters \
            else None
        self.saved_at = resumed_from  # the checkpoint resumed from is not saved again
        self._prepare_run_dir(plan)
        self.logger = MetricsLogger(self.run_dir, cfg.logging, cfg.to_dict(), self.is_logger,
                                    resume_iteration=self.state.iteration, run_name=cfg.run.name)
        self.flops = train_flops_figures(cfg.model, cfg.train.seq_len, copy_shape(cfg), cfg.recompute.granularity)
        self.speed = SpeedMonitor(
            flops_per_token=self.flops["flops_per_token"],
            tokens_per_step=cfg.train.global_batch * cfg.train.seq_len,
            world_size=self.layout.world_size,
            peak_tflops=cfg.logging.peak_tflops or default_peak_tflops(),
            total_iters=self.total_iters,
        )
        self.profiler = StepProfiler(t.profile_steps, self.run_dir / "profile.json", self.is_logger)
        n_params = sum(p.numel() for c in self.chunks for p in c.parameters())
        rank0_print(f"[train] layout tp={self.layout.tp} pp={self.layout.pp} dp={self.layout.dp} cp={self.layout.cp} "
                    f"vpp={self.layout.vpp} sp={self.layout.sp}; rank-0 parameters {n_params:,}; "
                    f"{self.num_micro} micro-batches/step; {self.total_iters} iterations; "
                    f"copy head {'on' if cfg.copy_head.enabled else 'off'}")

    def _prepare_run_dir(self, plan: StartPlan) -> None:
        """Rank 0, once every check passed: delete old checkpoints (checkpoint.overwrite) or set newer ones
        aside (a rollback), write config.yaml, report the plan's notes."""
        import torch.distributed as dist

        dist.barrier()  # every rank passed its checks (model, data, the checkpoint's data position)
        if self.is_logger:
            apply_plan(plan, self.run_dir / "checkpoints")
            self.run_dir.mkdir(parents=True, exist_ok=True)
            head = self.cfg.model.lm_head_loss
            dump_run_config(self.given, self.run_dir / "config.yaml",
                            resolved={"model.lm_head_loss": head} if head != self.given.model.lm_head_loss else None)
            for note in plan.notes:
                print(note, flush=True)
        dist.barrier()  # nobody saves into run.dir before it is ready

    def _load(self, plan: StartPlan) -> None:
        if plan.checkpoint is None:
            return
        path = plan.checkpoint.path
        restored = self.checkpointer.load(path, self.chunks, self.optimizer, self.scheduler, plan.load_optimizer)
        self.state = restored["train_state"]
        if restored["data"] is not None:
            self.train_data.load_state_dict(restored["data"])
        saved, now = (layout_text(restored[key]) for key in ("saved_layout", "layout"))
        where = (f"(same layout); {now}" if restored["same_layout"] else
                 f"(new layout); saved at {saved}, running at {now}: RNG states start fresh")
        rank0_print(f"[train] {'resumed from' if plan.resumed else 'started from'} {path} at iteration "
                    f"{self.state.iteration} {where}")

    def save(self) -> None:
        if not self.cfg.checkpoint.enabled:
            return
        self.checkpointer.save(self.chunks, self.optimizer, self.scheduler, self.state,
                               self.train_data.state_dict(), self.cfg.to_dict())
        self.saved_at = self.state.iteration

    def validation_batches(self) -> List[Dict[str, torch.Tensor]]:
        """The first train.eval_iters validation micro-batches of this DP rank (the same batches each time)."""
        batches = []
        for batch in self.val_data:
            batches.append(batch)
            if len(batches) == self.cfg.train.eval_iters:
                break
        return batches

    def print(self, line: str) -> None:
        """A console line from rank 0."""
        rank0_print(line)

    def evaluate(self) -> Dict[str, float]:
        """Validation over train.eval_iters micro-batches per DP rank (the same batches each time).

        val_loss is the NLL of the model's full distribution (the mixture for CPLM), val_lm_loss the LM head's
        own, val_objective the optimized loss (with any auxiliary terms)."""
        batches = self.validation_batches()
        m = eval_step(self.chunks, batches, self.cfg.train.seq_len, self.cfg.train.micro_batch,
                      self.cfg.data.document_masking)
        return {"val_loss": m["mix_loss"], "val_lm_loss": m["lm_loss"], "val_objective": m["loss"],
                "val_ppl": math.exp(min(m["mix_loss"], 50.0)), "val_tokens": m["tokens"]}

    def run(self) -> int:
        """Train to the end (0), or stop early with a checkpoint (RESUME_EXIT_CODE)."""
        cfg, t = self.cfg, self.cfg.train
        stop = self.stop
        guard = NonFiniteGuard(t.max_nonfinite_steps)
        log_due, eval_due = Cadence(t.log_interval, also_at=self.total_iters), Cadence(t.eval_interval)
        policy = StopPolicy(cfg.checkpoint.interval, t.exit_after_iters, launch_start=self.state.iteration)
        try:
            for callback in self.callbacks:
                callback.on_start(self)
            while self.state.iteration < self.total_iters:
                self.profiler.begin(self.state.iteration + 1)
                self.speed.begin_step()
                batches, self._first_batches = self._first_batches or take(self.train_data, self.num_micro), None
                result = train_step(self.chunks, self.optimizer, self.scheduler, batches, t.seq_len,
                                    t.micro_batch, cfg.data.document_masking)
                self.speed.end_step()
                self.state.iteration += 1
                self.profiler.end(self.state.iteration)
                self.state.consumed_tokens += t.global_batch * t.seq_len
                it = self.state.iteration
                self.state.skipped_steps += int(result.skipped)
                scale = _loss_scale(self.optimizer) if result.skipped or guard.overflows else None  # no sync per step
                note = guard.observe(it, result.skipped, result.metrics["loss"], scale)
                if note:
                    rank0_print(note)
                if log_due.due(it):
                    self._log(result)
                if self.val_data is not None and eval_due.due(it):
                    val = self.evaluate()
                    rank0_print(f"[eval] iter {it} | val loss {val['val_loss']:.4f} | ppl {val['val_ppl']:.2f}")
                    self.logger.log({"iteration": it, **val})
                for callback in self.callbacks:
                    callback.on_iteration(self, it)
                self.checkpointer.poll()
                reason = policy.stop_reason(it, stop.requested(), stop.received)
                if policy.save_due(it, stopping=reason is not None):
                    self.save()
                if reason is not None:
                    rank0_print(f"[train] stopping at iteration {it} ({reason}); exit code {RESUME_EXIT_CODE} = resume me")
                    self._write_summary(stopped_early=True)  # a launch stopped early still reports its throughput
                    return RESUME_EXIT_CODE
            if self.saved_at != self.state.iteration:
                self.save()
            self._write_summary(trained=self.state.iteration > policy.launch_start)
            rank0_print(f"[train] done: {self.state.iteration} iterations, {self.state.consumed_tokens:,} tokens")
            return 0
        finally:
            self.profiler.close()
            self.checkpointer.close()
            self.logger.close()
            stop.restore()
            self._release_lock()

    def _write_summary(self, stopped_early: bool = False, trained: bool = True) -> None:
        """RUN_DIR/run_record.json (training/run_record.py): one throughput record of this launch (scaling studies
        aggregate these); a launch stopped early (exit 75) writes run_record_stopped_early.json instead (its run
        is not finished). A launch that trained nothing (a relaunch of a finished run) keeps an existing record
        as it was (under either of its names)."""
        import torch.distributed as dist

        from cplm_megatron.training.run_record import Layout, RunRecord, run_record_path, write_run_record

        peak = torch.tensor([peak_memory_gib()], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            peak = peak.cuda()
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        if not self.is_logger:
            return
        existing = run_record_path(self.run_dir, stopped_early)
        if not trained and existing is not None:
            print(f"[train] {existing} kept as it was: this launch trained no iteration", flush=True)
            return
        speed = self.speed.steady()
        write_run_record(self.run_dir, RunRecord(
            preset=self.cfg.model.preset,
            copy_head=self.cfg.copy_head.enabled,
            layout=Layout(tp=self.layout.tp, pp=self.layout.pp, cp=self.layout.cp, dp=self.layout.dp,
                          vpp=self.layout.vpp, sp=self.layout.sp, world_size=self.layout.world_size),
            nodes=int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1"))),
            device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            seq_len=self.cfg.train.seq_len,
            global_batch=self.cfg.train.global_batch,
            iterations=self.state.iteration,
            tokens_per_sec=speed.get("tokens_per_sec"),
            tflops_per_device=speed.get("tflops_per_device"),
            mfu=speed.get("mfu"),
            step_time=speed.get("step_time"),
            peak_memory_gib=float(peak.item()),
            flops_per_token=self.speed.flops_per_token,
            config_hash=self.cfg.hash(),
            stopped_early=stopped_early,
            measured_steps=speed.get("measured_steps"),
            includes_warmup=bool(speed.get("includes_warmup")),
            lm_head_loss=self.cfg.model.lm_head_loss,
            model_flops_per_token=self.flops["model_flops_per_token"],
            causal_flops_per_token=self.flops["causal_flops_per_token"],
            memory_estimate_gib=memory_needed(self.cfg, self.layout.dp) / GIB,
        ))

    def _log(self, result) -> None:
        m = result.metrics
        rec = {
            "iteration": self.state.iteration,
            "loss": m["mix_loss"],  # the output distribution's NLL (the mixture's for CPLM), as validation reports
            "objective": m["loss"],  # what the optimizer minimizes (+ the copy head's auxiliary terms)
            "lm_loss": m["lm_loss"],
            "lr": result.lr,
            "grad_norm": result.grad_norm,
            "consumed_tokens": self.state.consumed_tokens,
            "skipped_steps": self.state.skipped_steps,
            "time": time.time(),
            **self.speed.interval(self.state.iteration),
        }
        if self.cfg.copy_head.enabled:  # whatever else the model reports (CPLMGPTModel.metric_names)
            rec.update({k: v for k, v in m.items() if k not in rec and k not in ("tokens", "mix_loss")})
        rec.update(memory_gib())
        if self.is_logger:
            c = self.cfg.copy_head
            terms = objective_terms(c.lm_loss_weight, c.copy_loss_weight) if c.enabled else None
            print(format_line(rec, self.total_iters, terms), flush=True)
        self.logger.log(rec)


def resolve_lm_head_loss(cfg: RunConfig, dp: int, local_processes: int) -> tuple[RunConfig, Optional[str]]:
    """`model.lm_head_loss: auto` resolved for this machine (model/lm_head_choice.py) and the line that says so;
    any other value as it is (no line)."""
    if cfg.model.lm_head_loss != "auto":
        return cfg, None
    from dataclasses import replace

    from cplm_megatron.model.lm_head_choice import choose_lm_head_loss
    from cplm_megatron.training.preflight import available_memory, memory_needed

    def with_path(path: str) -> RunConfig:
        return replace(cfg, model=replace(cfg.model, lm_head_loss=path))

    have, _ = available_memory(local_processes)
    cuda = torch.cuda.is_available()
    device = f"the GPU's {have / 2**30:.1f} GiB" if cuda else f"the {have / 2**30:.1f} GiB of host memory per process"
    p, t = cfg.parallel, cfg.train
    choice = choose_lm_head_loss(cfg.model, t.seq_len * t.micro_batch // p.cp, p.tp,
                                 4 if cfg.precision.dtype == "fp32" else 2, have, device, cuda,
                                 fits=lambda path: memory_needed(with_path(path), dp) <= have)
    return with_path(choice.path), f"[train] model.lm_head_loss=auto -> {choice.path}: {choice.reason}"


def _loss_scale(optimizer) -> Optional[float]:
    """The optimizer's current 16-bit loss scale (1 without scaling; None if it has none)."""
    try:
        return float(optimizer.get_loss_scale())
    except (AttributeError, TypeError, RuntimeError):
        return None


def _tree_bytes(path: Path) -> float:
    """Bytes of the files under `path` (0 if it does not exist)."""
    return float(sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()))


def memory_gib() -> Dict[str, object]:
    """This process's memory now and at its peak: CUDA allocated, or the host's resident set on CPU."""
    if torch.cuda.is_available():
        return {"mem_device": "cuda", "mem_gib": torch.cuda.memory_allocated() / 2**30,
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}
    import psutil

    now = psutil.Process().memory_info().rss / 2**30
    return {"mem_device": "host", "mem_gib": now, "peak_mem_gib": max(now, peak_memory_gib())}


def peak_memory_gib() -> float:
    """Peak device memory of this process: CUDA max allocated, or the CPU max RSS (getrusage's reads the kernel's
    per-CPU RSS counters unsummed, up to some MiB below the RSS now: never less than that)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    import psutil

    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB on Linux
               psutil.Process().memory_info().rss / 2**30)


def train(cfg: RunConfig, callbacks: Sequence[Callback] = ()) -> int:
    """Build a Trainer with `callbacks` and run it; tears down the process groups at the end."""
    from cplm_megatron.data.stop import StopRequested
    from cplm_megatron.parallel.distributed import destroy_distributed

    try:
        return Trainer(cfg, callbacks).run()
    except StopRequested as e:  # a stop signal before the first step: nothing to save
        rank0_print(f"[train] {e}; exit code {RESUME_EXIT_CODE} = resume me")
        return RESUME_EXIT_CODE
    finally:
        destroy_distributed()
