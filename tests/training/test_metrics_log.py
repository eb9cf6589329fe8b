"""What the console and the logging backends say: `loss` is the comparable NLL whichever record version wrote it,
the objective and its terms are labelled apart, memory is on the line, TensorBoard writes event files (and drops a
resumed run's recomputed steps)."""
from __future__ import annotations

from pathlib import Path

from cplm_megatron.run_config import LoggingConfig
from cplm_megatron.training.metrics_log import (
    TENSORBOARD_DIR,
    MetricsLogger,
    format_line,
    objective_terms,
    record_nll,
    record_objective,
)

CPLM = {"iteration": 20, "loss": 6.2103, "objective": 12.5712, "lm_loss": 6.3609, "gate_mean": 0.123, "lr": 3e-4,
        "grad_norm": 1.5, "mem_device": "cuda", "mem_gib": 12.3, "peak_mem_gib": 18.24}
OLD_CPLM = {"iteration": 20, "loss": 12.5712, "mix_loss": 6.2103, "lm_loss": 6.3609, "lr": 3e-4}  # before `objective`
BASELINE = {"iteration": 20, "loss": 6.7, "objective": 6.7, "lm_loss": 6.7, "lr": 3e-4, "mem_device": "host",
            "mem_gib": 1.0, "peak_mem_gib": 1.5}


def test_loss_is_the_nll_in_every_record_version_and_the_objective_is_labelled_apart():
    assert record_nll(CPLM) == record_nll(OLD_CPLM) == 6.2103 and record_objective(OLD_CPLM) == 12.5712
    assert record_nll({"loss": 6.7, "lm_loss": 6.7}) == 6.7  # an old baseline record
    terms = objective_terms(1.0, 0.0)
    assert terms == "loss + 1×lm-head" and objective_terms(0.0, 0.0) is None
    assert objective_terms(0.5, 2.0) == "loss + 0.5×lm-head + 2×copy"
    line = format_line(CPLM, 100, terms)
    assert line.startswith("iter 20/100 | loss 6.2103 | lm-head 6.3609 | objective 12.5712 (loss + 1×lm-head) | gate")
    assert "| mem 12.30/18.24 GiB" in line
    assert format_line(OLD_CPLM, 100, terms).startswith("iter 20/100 | loss 6.2103 | lm-head 6.3609 | objective 12.5712")
    base = format_line(BASELINE, 100)
    assert base.startswith("iter 20/100 | loss 6.7000 | lr") and "objective" not in base
    assert "| host mem 1.00/1.50 GiB" in base
    rates = {"tokens_per_sec": 1000.0, "tflops_per_device": 0.1, "mfu": 0.01}
    assert format_line({**BASELINE, **rates, "warmup": True}, 100).endswith("| tok/s 1,000 (warm-up) | TFLOP/s/dev 0.100 "
                                                                            "| MFU 1.00%")  # no rate yet: no ETA
    assert format_line({**BASELINE, **rates, "eta_sec": 75.6}, 100).endswith("| MFU 1.00% | ETA 0:01:15")


def _scalars(log_dir: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_tensorboard_writes_every_number_and_a_resume_drops_the_steps_it_recomputes(tmp_path: Path):
    cfg = LoggingConfig(wandb=False, tensorboard=True)
    logger = MetricsLogger(tmp_path, cfg, {}, active=True)
    for it in (1, 2, 3, 4):
        logger.log({**CPLM, "iteration": it, "loss": 10.0 - it})
    logger.close()
    assert list((tmp_path / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert _scalars(tmp_path / TENSORBOARD_DIR, "loss") == {1: 9.0, 2: 8.0, 3: 7.0, 4: 6.0}
    assert set(_scalars(tmp_path / TENSORBOARD_DIR, "objective")) == {1, 2, 3, 4}
    resumed = MetricsLogger(tmp_path, cfg, {}, active=True, resume_iteration=2)  # the checkpoint was at 2
    resumed.log({**CPLM, "iteration": 3, "loss": 1.5})
    resumed.close()
    assert _scalars(tmp_path / TENSORBOARD_DIR, "loss") == {1: 9.0, 2: 8.0, 3: 1.5}
    assert MetricsLogger(tmp_path / "off", LoggingConfig(wandb=False), {}, active=True)._tensorboard is None
