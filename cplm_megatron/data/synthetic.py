"""Synthetic token tasks that probe copying: SpamLang, repeated random spans, passkey retrieval.

Two copy tasks: `copy` (a span and its repeat; the repeat always starts at seq_len/2, so a model can learn
where to copy from by position) and `copy_random` (a span of random length recurring at a random later offset
inside random tokens: where to copy from must be found by content, as in text).

Every sample is a pure function of (task, seed, sample index), so loaders over these tasks shard by
data-parallel rank and resume exactly from a sample counter. Token id 0 is reserved (EOD/padding);
task symbols are drawn from [first_token, vocab_size).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple

import torch

TASKS = ("spamlang", "copy", "copy_random", "passkey")
COPY_LAYOUTS = ("half", "random")  # copy_sample / copy_random_sample
STATE_FORMAT = "cplm-synthetic-loader/1"


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + index) % (2**63 - 1))


def spamlang_sample(index: int, seq_len: int, vocab_size: int, seed: int = 0, first_token: int = 1) -> torch.Tensor:
    """Godey & Artzi's SpamLang: one random symbol repeated seq_len + 1 times."""
    g = _generator(seed, index)
    symbol = int(torch.randint(first_token, vocab_size, (1,), generator=g))
    return torch.full((seq_len + 1,), symbol, dtype=torch.long)


def copy_sample(index: int, seq_len: int, vocab_size: int, seed: int = 0, first_token: int = 1) -> Tuple[torch.Tensor, int]:
    """A random span of length (seq_len + 1) // 2 followed by its repeat; returns (tokens, repeat start)."""
    g = _generator(seed, index)
    half = (seq_len + 1) // 2
    span = torch.randint(first_token, vocab_size, (half,), generator=g)
    tokens = torch.cat([span, span, span[: seq_len + 1 - 2 * half]])
    return tokens, half


@dataclass
class CopySample:
    """Tokens in which one span recurs: the repeat (but its first token) is what copying predicts."""

    tokens: torch.Tensor  # [length]
    repeat_start: int  # position of the repeat's first token
    repeat_len: int


def copy_random_sample(index: int, seq_len: int, vocab_size: int, seed: int = 0, first_token: int = 1) -> CopySample:
    """seq_len + 1 random tokens in which a span of random length (1/8 to 1/2 of them) starting at a random
    position recurs at a random later position (the two never overlap)."""
    n = seq_len + 1
    if n < 8:
        raise ValueError(f"copy_random needs seq_len >= 7 (a span of >= 2 tokens and its repeat), got {seq_len}")
    g = _generator(seed, index)
    tokens = torch.randint(first_token, vocab_size, (n,), generator=g)
    span = int(torch.randint(max(2, n // 8), n // 2 + 1, (1,), generator=g))
    start = int(torch.randint(0, n - 2 * span + 1, (1,), generator=g))
    repeat = int(torch.randint(start + span, n - span + 1, (1,), generator=g))
    tokens[repeat:repeat + span] = tokens[start:start + span]
    return CopySample(tokens=tokens, repeat_start=repeat, repeat_len=span)


def copy_task_sample(layout: str, index: int, seq_len: int, vocab_size: int, seed: int = 0) -> CopySample:
    """A sample of the copy task of `layout` ('half': `copy`, 'random': `copy_random`)."""
    if layout == "half":
        tokens, half = copy_sample(index, seq_len, vocab_size, seed)
        return CopySample(tokens=tokens, repeat_start=half, repeat_len=seq_len + 1 - half)
    if layout == "random":
        return copy_random_sample(index, seq_len, vocab_size, seed)
    raise ValueError(f"unknown copy layout {layout!r}; choose one of {COPY_LAYOUTS}")


@dataclass
class PasskeySample:
    """Filler with a needle `key_marker k_1..k_n` inside, then `query_marker` and the key to retrieve."""

    tokens: torch.Tensor  # [length]
    answer_start: int  # position of the first answer token
    answer_len: int


def passkey_sample(index: int, length: int, depth: float, vocab_size: int, seed: int = 0, key_len: int = 4,
                   first_token: int = 3) -> PasskeySample:
    """Needle at relative `depth` of a random-filler context; tokens 1/2 mark the key and the query."""
    g = _generator(seed, index)
    key = torch.randint(first_token, vocab_size, (key_len,), generator=g)
    n_filler = length - 2 * (key_len + 1)
    if n_filler < 1:
        raise ValueError(f"passkey length {length} is too short for a key of {key_len} tokens")
    filler = torch.randint(first_token, vocab_size, (n_filler,), generator=g)
    at = int(round(depth * n_filler))
    needle = torch.cat([torch.tensor([1]), key])
    query = torch.cat([torch.tensor([2]), key])
    tokens = torch.cat([filler[:at], needle, filler[at:], query])
    return PasskeySample(tokens=tokens, answer_start=len(tokens) - key_len, answer_len=key_len)


def training_tasks(task: str) -> List[str]:
    """The parts of a training task: one of TASKS, or several joined by '+' (samples alternate by index:
    'copy+passkey' gives copy at even indices, passkey at odd); ValueError naming the choices otherwise."""
    parts = task.split("+") if isinstance(task, str) else []
    if not parts or any(p not in TASKS for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"unknown synthetic training task {task!r}; choose one of {TASKS} or several joined by "
                         f"'+' (e.g. copy+passkey)")
    return parts


# passkey training samples put the needle at depth frac(index x golden ratio): spread evenly over [0, 1)
_GOLDEN = 0.6180339887498949


def task_sample(task: str, index: int, seq_len: int, vocab_size: int, seed: int) -> torch.Tensor:
    """seq_len + 1 tokens of a training task (a mixture picks its part by index)."""
    parts = training_tasks(task)
    part = parts[index % len(parts)]
    if part == "spamlang":
        return spamlang_sample(index, seq_len, vocab_size, seed)
    if part == "copy":
        return copy_sample(index, seq_len, vocab_size, seed)[0]
    if part == "copy_random":
        return copy_random_sample(index, seq_len, vocab_size, seed).tokens
    return passkey_sample(index, seq_len + 1, (index * _GOLDEN) % 1.0, vocab_size, seed).tokens


def make_batch(samples: List[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Stack [seq_len + 1] samples into the loader batch contract (one document per row)."""
    tokens = torch.stack(samples)
    b, n = tokens.shape
    s = n - 1
    return {
        "tokens": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
        "loss_mask": torch.ones(b, s, dtype=torch.float32),
        "position_ids": torch.arange(s).expand(b, s).contiguous(),
        "document_ids": torch.zeros(b, s, dtype=torch.long),
    }


class SyntheticLoader:
    """Endless micro-batches of a synthetic task for one DP rank; resumable from a sample counter.

    Global sample i goes to DP rank (i // micro_batch) % dp_size, so the global batch sequence does
    not depend on the data-parallel size.
    """

    def __init__(self, task: str, seq_len: int, vocab_size: int, micro_batch: int, dp_rank: int, dp_size: int,
                 seed: int = 0, start: int = 0):
        training_tasks(task)  # ValueError naming the choices
        self.task, self.seq_len, self.vocab_size = task, seq_len, vocab_size
        self.micro_batch, self.dp_rank, self.dp_size, self.seed = micro_batch, dp_rank, dp_size, seed
        self.step = start  # micro-batch steps taken by every rank (global counter / dp_size)

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> Dict[str, torch.Tensor]:
        first = (self.step * self.dp_size + self.dp_rank) * self.micro_batch
        self.step += 1
        return make_batch([task_sample(self.task, first + i, self.seq_len, self.vocab_size, self.seed)
                           for i in range(self.micro_batch)])

    def state_dict(self) -> Dict[str, Any]:
        return {"format": STATE_FORMAT, "task": self.task, "seed": self.seed, "step": self.step}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT or state.get("task") != self.task or state.get("seed") != self.seed:
            raise ValueError(f"checkpoint data state {state} does not match synthetic task {self.task!r} seed {self.seed}")
        self.step = int(state["step"])


def synthetic_val_batches(task: str, n_batches: int, micro_batch: int, seq_len: int, vocab_size: int,
                          dp_rank: int, dp_size: int, seed: int = 10_000_019) -> List[Dict[str, torch.Tensor]]:
    """A fixed validation set (different seed from training) for one DP rank."""
    loader = SyntheticLoader(task, seq_len, vocab_size, micro_batch, dp_rank, dp_size, seed)
    return [next(loader) for _ in range(n_batches)]
