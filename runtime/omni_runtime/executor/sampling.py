"""Token sampling for a whole decode batch at once, with per-row parameters.

Continuous batching mixes requests with different sampling settings in one decode step, so every
knob (temperature, top-k, top-p, min-p, repetition penalty, seed) is a per-row tensor and one
vectorised pass samples all rows. Randomness comes from a counter-based hash of (seed, step,
token id) instead of a stateful generator: a row's draw depends only on its own seed and step, so
a seeded request gives the same tokens whether it runs alone or next to fifteen others, and no
per-row generator objects or host round trips are needed.
"""

from __future__ import annotations

import random

import torch

from omni_runtime.contract.adapter import RowSampling

_MASK32 = 0xFFFFFFFF
__all__ = ["BatchSampler", "RowSampling", "hash_uniform"]


def hash_uniform(seed: torch.Tensor, step: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform numbers in (0, 1) of shape [rows, vocab], a pure function of (seed, step, token id).

    murmur3's 32-bit finaliser over a linear mix of the three counters; integer products may wrap
    in int64, which keeps their low 32 bits exact, and every intermediate is masked to 32 bits.
    """
    idx = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)
    x = ((seed[:, None] * 0x9E3779B1) & _MASK32) + ((step[:, None] * 0x85EBCA77) & _MASK32)
    x = (x + ((idx[None, :] * 0xC2B2AE3D) & _MASK32)) & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    x = x ^ (x >> 16)
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


class BatchSampler:
    """Per-slot sampling state on the model's device and one vectorised ``sample`` per step.

    Rows are addressed by slot index (0..slots-1). The scheduler keeps active rows dense in slots
    0..n-1, so ``sample(logits[:n])`` covers exactly the running batch; ``move`` follows the
    scheduler when it compacts a slot.
    """

    def __init__(self, *, slots: int, vocab_size: int, device: torch.device) -> None:
        self.slots = slots
        self.vocab_size = vocab_size
        self.device = device
        self.temperature = torch.ones(slots, device=device)
        self.top_p = torch.ones(slots, device=device)
        self.top_k = torch.zeros(slots, dtype=torch.int64, device=device)
        self.min_p = torch.zeros(slots, device=device)
        self.penalty = torch.ones(slots, device=device)
        self.seed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.step = torch.zeros(slots, dtype=torch.int64, device=device)
        # Host mirrors decide which (costly) passes a step needs at all.
        self._params: list[RowSampling] = [RowSampling() for _ in range(slots)]
        self._seen: torch.Tensor | None = None  # [slots, vocab] bool, made on the first penalty row
        self._suppress: torch.Tensor | None = None  # [slots, vocab] bool, made on first use

    @torch.inference_mode()
    def set_row(self, slot: int, params: RowSampling, *, history: list[int] | None = None) -> None:
        """Install a request's settings in ``slot``; ``history`` seeds the repetition penalty."""
        self._params[slot] = params
        self.temperature[slot] = max(0.0, params.temperature)
        self.top_p[slot] = params.top_p if 0.0 < params.top_p < 1.0 else 1.0
        self.top_k[slot] = params.top_k if 0 < params.top_k < self.vocab_size else 0  # all: off
        self.min_p[slot] = max(0.0, params.min_p)
        self.penalty[slot] = params.repetition_penalty if params.repetition_penalty > 0 else 1.0
        seed = params.seed if params.seed is not None else random.getrandbits(31)
        self.seed[slot] = seed & 0x7FFFFFFF
        self.step[slot] = 0
        if params.repetition_penalty != 1.0:
            seen = self._seen_table()
            seen[slot] = False
            if history:
                ids = torch.tensor([i for i in history if 0 <= i < self.vocab_size], device=self.device)
                seen[slot, ids] = True
        if params.suppress_tokens or self._suppress is not None:
            table = self._suppress_table()
            table[slot] = False
            if params.suppress_tokens:
                table[slot, torch.tensor(params.suppress_tokens, device=self.device)] = True

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s state into ``dst`` (the scheduler compacted the batch)."""
        self._params[dst] = self._params[src]
        for table in (
            self.temperature,
            self.top_p,
            self.top_k,
            self.min_p,
            self.penalty,
            self.seed,
            self.step,
        ):
            table[dst] = table[src]
        if self._seen is not None:
            self._seen[dst] = self._seen[src]
        if self._suppress is not None:
            self._suppress[dst] = self._suppress[src]

    @torch.inference_mode()
    def sample(
        self, logits: torch.Tensor, *, rows: list[int] | None = None, ready: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sample one token per row of ``logits`` [n, vocab].

        Row i of ``logits`` belongs to slot ``rows[i]`` (default: slot i, the dense running batch).
        ``ready`` (bool [n]) marks rows whose draw counts: others keep their step counter and
        history, so a row held for a step draws the same numbers when it resumes.
        """
        n = logits.shape[0]
        if rows is None:
            index: slice | torch.Tensor = slice(0, n)
            params = self._params[:n]
        else:
            index = torch.tensor(rows, dtype=torch.int64, device=self.device)
            params = [self._params[r] for r in rows]
        logits = logits[:, : self.vocab_size].float()
        if self._suppress is not None:
            logits = logits.masked_fill(self._suppress[index], float("-inf"))
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = self._seen_table()[index]
            pen = self.penalty[index][:, None]
            logits = torch.where(seen, torch.where(logits > 0, logits / pen, logits * pen), logits)
        greedy = torch.argmax(logits, dim=-1)
        if all(p.temperature <= 0.0 for p in params):
            tokens = greedy
        else:
            temp = self.temperature[index][:, None]
            scaled = logits / torch.where(temp > 0, temp, torch.ones_like(temp))
            if any(p.top_k > 0 or 0.0 < p.top_p < 1.0 or p.min_p > 0.0 for p in params):
                scaled = self._filter(scaled, index)
            u = hash_uniform(self.seed[index], self.step[index], scaled.shape[-1])
            gumbel = -torch.log(-torch.log(u))
            sampled = torch.argmax(scaled + gumbel, dim=-1)
            tokens = torch.where(temp[:, 0] > 0, sampled, greedy)
        advance = torch.ones(n, dtype=torch.int64, device=self.device) if ready is None else ready.long()
        self.step[index] += advance
        if self._seen is not None:
            slots = torch.arange(n, device=self.device) if rows is None else index
            self._seen[slots, tokens] |= advance.bool()
        return tokens

    @torch.inference_mode()
    def sample_dense(self, logits: torch.Tensor, *, ready: torch.Tensor) -> torch.Tensor:
        """``sample`` for rows ``0..n-1`` with no host reads: one fixed path a CUDA graph can hold.

        Every pass runs for every row, whatever its settings (a captured graph must not branch on
        them): suppression and the repetition penalty when their tables exist, then greedy and the
        filtered, hash-seeded draw, picked per row by its temperature. A row's token is the one
        ``sample`` draws for the same seed and step wherever its settings filter (top-k, top-p or
        min-p set, as the code predictor's always are); with none set, the top-p pass still drops
        tokens whose preceding probability mass rounds above 1.0 (float32 cumsum; a vanishing
        tail). ``ready`` (bool [n]) marks the rows whose step counter and history advance.
        """
        n = logits.shape[0]
        logits = logits[:, : self.vocab_size].float()
        if self._suppress is not None:
            logits = logits.masked_fill(self._suppress[:n], float("-inf"))
        if self._seen is not None:
            pen = self.penalty[:n][:, None]
            logits = torch.where(self._seen[:n], torch.where(logits > 0, logits / pen, logits * pen), logits)
        greedy = torch.argmax(logits, dim=-1)
        temp = self.temperature[:n][:, None]
        scaled = self._filter(logits / torch.where(temp > 0, temp, torch.ones_like(temp)), slice(0, n))
        u = hash_uniform(self.seed[:n], self.step[:n], scaled.shape[-1])
        sampled = torch.argmax(scaled - torch.log(-torch.log(u)), dim=-1)
        tokens = torch.where(temp[:, 0] > 0, sampled, greedy)
        self.step[:n] += ready.long()
        if self._seen is not None:
            self._seen[torch.arange(n, device=self.device), tokens] |= ready
        return tokens

    def _filter(self, scaled: torch.Tensor, index: slice | torch.Tensor) -> torch.Tensor:
        """Mask tokens outside min-p, top-k and top-p (nucleus) per row; at least one survives."""
        probs = torch.softmax(scaled, dim=-1)
        # The most likely token always survives min-p, so no row is left without a candidate.
        remove = probs < self.min_p[index][:, None] * probs.max(dim=-1, keepdim=True).values
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        ranks = torch.arange(scaled.shape[-1], device=self.device)[None, :]
        top_k = self.top_k[index][:, None]
        sorted_remove = (top_k > 0) & (ranks >= top_k)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_remove |= mass_before > self.top_p[index][:, None]
        sorted_remove[:, 0] = False
        remove |= torch.zeros_like(remove).scatter(1, order, sorted_remove)
        return scaled.masked_fill(remove, float("-inf"))

    def _seen_table(self) -> torch.Tensor:
        if self._seen is None:
            self._seen = torch.zeros(self.slots, self.vocab_size, dtype=torch.bool, device=self.device)
        return self._seen

    def _suppress_table(self) -> torch.Tensor:
        if self._suppress is None:
            self._suppress = torch.zeros(self.slots, self.vocab_size, dtype=torch.bool, device=self.device)
        return self._suppress
