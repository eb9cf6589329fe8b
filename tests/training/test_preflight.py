"""training/preflight.py's range notes: the cadences a launch never reaches are one line each (train.profile_steps
past the run's end is refused with the config: tests/training/test_profiling.py)."""
from cplm_megatron.run_config import load_run_config
from cplm_megatron.training.preflight import range_notes


def _cfg(**settings):
    """The tiny recipe with no cadence but `settings`'."""
    quiet = {"train.eval_interval": 0, "train.probe_interval": 0, "checkpoint.interval": 0}
    return load_run_config("tiny", [f"{k}={v}" for k, v in {**quiet, **settings}.items()])


def test_intervals_past_the_last_iteration_are_one_line_each():
    """train.iters=4 with validation every 50, probes every 10 and checkpoints every 100 ran silently without a
    single validation, probe after the first or periodic checkpoint."""
    cfg = _cfg(**{"train.iters": 4, "train.eval_interval": 50, "train.probe_interval": 10,
                  "checkpoint.interval": 100, "data.val_streams": "data/stdlib/val"})
    assert range_notes(cfg) == [
        "[config] train.eval_interval=50: no validation in this launch's 4 iterations (set train.eval_interval <= 4 "
        "to validate, 0 to say none)",
        "[config] train.probe_interval=10: no probe in this launch's 4 iterations after the one before the first step",
        "[config] checkpoint.interval=100: no periodic checkpoint in this launch's 4 iterations; it saves at the end "
        "(and on a stop signal)"]
    reached = _cfg(**{"train.iters": 100, "train.eval_interval": 50, "train.probe_interval": 10,
                      "checkpoint.interval": 100, "data.val_streams": "data/stdlib/val"})
    assert range_notes(reached) == []
    assert range_notes(_cfg(**{"train.iters": 4, "train.eval_interval": 50, "data.val_streams": "[]"})) == []
    assert range_notes(_cfg(**{"train.iters": 4, "checkpoint.interval": 100, "checkpoint.enabled": False})) == []


def test_a_resumed_launch_counts_from_where_it_resumes():
    cfg = _cfg(**{"train.iters": 110, "checkpoint.interval": 50, "train.profile_steps": "[95,105]"})
    assert range_notes(cfg, start=100) == [
        "[config] checkpoint.interval=50: no periodic checkpoint in this launch's iterations 101..110; it saves at "
        "the end (and on a stop signal)",
        "[config] train.profile_steps=[95, 105]: this launch resumes at iteration 100, only 101..105 profiled"]
    assert range_notes(cfg, start=90) == []  # 100 is a multiple of 50; 95..105 all ahead
    assert range_notes(cfg, start=110) == []  # finished: nothing to train
    late = _cfg(**{"train.iters": 200, "train.profile_steps": "[5,8]"})
    assert range_notes(late, start=10) == [
        "[config] train.profile_steps=[5, 8]: this launch resumes at iteration 10, nothing profiled"]


def test_probe_lengths_the_run_cannot_give_are_one_line_each():
    """train.probe_copy_length past the model's positions was cut to them silently, and one whose text spans
    (half of it) are longer than a validation row logged no text-copy figure at all, silently."""
    cfg = _cfg(**{"train.iters": 40, "train.probe_interval": 10, "train.probe_copy_length": 100000,
                  "train.seq_len": 128, "data.val_streams": "data/stdlib/val"})
    assert range_notes(cfg) == [
        "[config] train.probe_copy_length=100000 is past model.max_position_embeddings=512: the probes use 512 tokens",
        "[config] train.probe_copy_length=512: no text-copy figure (its spans of 256 tokens cannot come from "
        "validation rows of train.seq_len=128; set train.probe_copy_length <= 256)"]
    fits = _cfg(**{"train.iters": 40, "train.probe_interval": 10, "train.probe_copy_length": 256,
                   "train.seq_len": 128, "data.val_streams": "data/stdlib/val"})
    assert range_notes(fits) == []
