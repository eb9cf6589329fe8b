"""The training loop's decisions (cplm_megatron/training/step_policies.py), in-process: log/eval cadence, the non-finite
guard, when to checkpoint and when a launch stops early (the end-to-end behaviour: tests/training/test_pretrain.py)."""
import math

import pytest

from cplm_megatron.training.step_policies import Cadence, NonFiniteGuard, NonFiniteLossError, StopPolicy


def test_cadence_every_interval_and_at_the_end():
    assert [i for i in range(1, 11) if Cadence(4, also_at=10).due(i)] == [4, 8, 10]
    assert [i for i in range(1, 11) if Cadence(0).due(i)] == []  # 0: never (train.eval_interval=0)
    assert [i for i in range(1, 5) if Cadence(1).due(i)] == [1, 2, 3, 4]


def test_non_finite_guard_counts_skipped_steps_in_a_row_and_stops_at_the_limit():
    guard = NonFiniteGuard(max_in_a_row=3)
    assert guard.observe(1, skipped=False, loss=2.0) is None
    assert "non-finite loss (nan), step skipped (1 in a row)" in guard.observe(2, True, math.nan)
    assert "(2 in a row)" in guard.observe(3, True, math.inf)
    assert guard.observe(4, False, 1.9) is None and guard.in_a_row == 0  # a good step resets the count
    guard.observe(5, True, math.nan)
    guard.observe(6, True, math.nan)
    with pytest.raises(NonFiniteLossError, match=r"non-finite for 3 consecutive steps \(last at iteration 7\).*"
                                                 r"train.max_nonfinite_steps"):
        guard.observe(7, True, math.nan)


def test_fp16_loss_scale_overflows_are_not_non_finite_losses():
    """The loss scaler's warm-up skips ~26 steps with a finite loss (issue 43 item 8: every fp16 run stopped at
    iteration 5 saying 'non-finite loss (15.37)'): said once with the scale, again when a step is taken; a
    scaler that never settles ends the run naming bf16."""
    guard = NonFiniteGuard(max_in_a_row=3)
    first = guard.observe(1, True, 15.37, loss_scale=2.0**32)
    assert first.startswith("[train] iteration 1: gradients overflowed fp16 at loss scale 4.29497e+09 (loss 15.3700 "
                            "is finite): step skipped, the loss scale is lowered")
    assert all(guard.observe(i, True, 15.0, loss_scale=2.0**(32 - i // 2)) is None for i in range(2, 27))
    assert guard.in_a_row == 0 and guard.overflows == 26
    assert guard.observe(27, False, 14.9, loss_scale=2.0**19) == ("[train] iteration 27: step taken at loss scale "
                                                                   "524288 after 26 skipped for gradient overflow")
    assert "(1 in a row)" in guard.observe(28, True, math.nan)  # a non-finite loss is still counted as one
    assert guard.observe(29, True, 3.0, 1.0).startswith("[train] iteration 29: gradients overflowed")
    with pytest.raises(NonFiniteLossError, match=r"overflowed 16-bit floats for 70 consecutive steps .* use "
                                                 r"precision.dtype=bf16"):
        for i in range(30, 100):
            guard.observe(i, True, 3.0, 1.0)


def test_stop_policy_checkpoints_on_interval_and_on_every_early_stop():
    policy = StopPolicy(checkpoint_interval=5, exit_after_iters=None, launch_start=0)
    assert [i for i in range(1, 12) if policy.save_due(i, stopping=False)] == [5, 10]
    assert policy.save_due(7, stopping=True)
    assert policy.stop_reason(7, stop_requested=False) is None
    assert policy.stop_reason(7, stop_requested=True, signal=15) == "signal 15"
    # the collective says stop, this rank saw no signal itself: it stops too (every rank must)
    assert policy.stop_reason(7, stop_requested=True, signal=None) == "a stop signal on another rank"
    no_interval = StopPolicy(checkpoint_interval=0, exit_after_iters=None, launch_start=0)
    assert not any(no_interval.save_due(i, stopping=False) for i in range(1, 20))


def test_exit_after_iters_counts_from_the_launch_not_from_iteration_0():
    policy = StopPolicy(checkpoint_interval=0, exit_after_iters=3, launch_start=10)  # resumed at 10
    assert [policy.stop_reason(i, False) for i in (11, 12)] == [None, None]
    assert policy.stop_reason(13, False) == "train.exit_after_iters"
