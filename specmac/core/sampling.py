"""Sampling parameters, the logits -> warped-probabilities transform (numpy, float64), and the
coupled sampler's per-position Gumbel noise.

The *warped* distribution is what speculative decoding preserves, so the draft and the target go
through exactly this function with the same parameters. The coupled sampler (``sampler="coupled"``)
takes at output position j the argmax of log p_j + g_j, with g_j Gumbel noise keyed by (seed, j)
alone: an exact sample of p_j that the draft can reproduce with the same noise, so the text depends
on the seed only, whatever drafted it (Daliri, Musco and Suresh, arXiv 2408.07978).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from specmac.errors import BadOption

# below this, logits / temperature overflows float64 for ordinary logits and warp gives NaN rows;
# temperature 0 (greedy) is the way to ask for the argmax
MIN_TEMPERATURE = 1e-6
SAMPLERS = ("rejection", "coupled")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy, else at least MIN_TEMPERATURE (smaller ones underflow: an error,
    not silently greedy); top_k 0, top_p 1 and min_p 0 switch those filters off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    sampler: str = "rejection"

    def __post_init__(self) -> None:
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        if not (isinstance(t, (int, float)) and math.isfinite(t) and (t == 0 or t >= MIN_TEMPERATURE)):
            raise BadOption(f"temperature {t!r} is out of range: use 0 (greedy) or a number >= "
                            f"{MIN_TEMPERATURE:g}", param="temperature")
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise BadOption(f"top_k {k!r} is out of range: use an integer >= 0 (0 = off)", param="top_k")
        if not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise BadOption(f"top_p {p!r} is out of range: use a number in (0, 1] (1 = off)", param="top_p")
        if not (isinstance(m, (int, float)) and 0 <= m < 1):
            raise BadOption(f"min_p {m!r} is out of range: use a number in [0, 1) (0 = off)", param="min_p")
        if self.sampler not in SAMPLERS:
            raise BadOption(f"sampler {self.sampler!r} is not a sampler: use one of {', '.join(SAMPLERS)}",
                            param="sampler")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def coupled(self) -> bool:
        """The coupled sampler at T > 0 (at T = 0 every sampler is plain greedy)."""
        return self.sampler == "coupled" and not self.greedy

    @property
    def filtered(self) -> bool:
        """Whether top-k, top-p or min-p cut the support."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    def to_dict(self) -> dict:
        return asdict(self)


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Logits [..., V] -> probabilities [..., V] (float64) after temperature, top-k, top-p, min-p.

    Greedy (temperature 0) gives the one-hot of the argmax (lowest id on ties).
    Entries of -inf (padded vocabulary rows, masked ids) get probability 0.
    """
    x = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        out = np.zeros_like(x)
        np.put_along_axis(out, np.argmax(x, axis=-1)[..., None], 1.0, axis=-1)
        return out
    x = x / params.temperature
    x = x - np.max(x, axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    V = p.shape[-1]
    if 0 < params.top_k < V:
        # keep the k largest; ties at the boundary are all kept, so the rule is order-free
        kth = -np.partition(-p, params.top_k - 1, axis=-1)[..., params.top_k - 1 : params.top_k]
        p = np.where(p >= kth, p, 0.0)
    if params.top_p < 1:
        # smallest prefix of the sorted distribution whose mass reaches top_p (after top-k)
        s = np.sort(p, axis=-1)[..., ::-1]
        c = np.cumsum(s, axis=-1) / s.sum(axis=-1, keepdims=True)
        n_keep = np.minimum((c < params.top_p).sum(axis=-1, keepdims=True), V - 1)
        cutoff = np.take_along_axis(s, n_keep, axis=-1)
        p = np.where(p >= cutoff, p, 0.0)
    if params.min_p > 0:
        p = np.where(p >= params.min_p * p.max(axis=-1, keepdims=True), p, 0.0)
    return p / p.sum(axis=-1, keepdims=True)


class WarpedRows:
    """``warp(logits, params)`` a row at a time, on first use: ``rows[i]`` is row i.

    The rejection rule reads rows only up to the first rejection, so a wide verification pass
    (K + 1 rows of a 150k vocabulary) does not pay for warping, in float64, rows it never reads.
    Row i equals ``warp(logits, params)[i]`` exactly: every step of warp works along the row.
    """

    def __init__(self, logits: np.ndarray, params: SamplingParams) -> None:
        self.logits, self.params = logits, params
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, i: int) -> np.ndarray:
        i = range(len(self.logits))[i]  # bounds and negative indices as a list has them
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = warp(self.logits[i], self.params)
        return row


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector [V] (inverse CDF; exact zeros are never drawn)."""
    c = np.cumsum(probs)
    i = min(int(np.searchsorted(c, rng.random() * c[-1], side="right")), len(probs) - 1)
    while probs[i] == 0:  # round-off can land past the last nonzero id; step back to it
        i -= 1
    return i


# --- the coupled sampler -------------------------------------------------------------------

_TINY_U = np.float32(2.0**-25)  # uniforms are multiples of 2**-24 in [0, 1); 0 would give g = +inf


def gumbel(seed: int, j: int, n_vocab: int) -> np.ndarray:
    """Gumbel noise g [n_vocab] (float32) of output position j, keyed by (seed, j) alone: a PCG64
    stream seeded by SeedSequence((seed, j)), so any position is drawn without the ones before it.
    g = -log(-log u), u uniform at float32 resolution (2**-24)."""
    u = np.random.Generator(np.random.PCG64(np.random.SeedSequence((seed, j)))).random(n_vocab,
                                                                                      dtype=np.float32)
    np.maximum(u, _TINY_U, out=u)
    np.log(u, out=u)
    np.negative(u, out=u)
    np.log(u, out=u)
    return np.negative(u, out=u)


def perturb(logits: np.ndarray, params: SamplingParams, g: np.ndarray) -> np.ndarray:
    """log p + g up to a constant per row: logits / T + g [V] (float64), -inf outside the warped
    support (top-k, top-p, min-p, masked ids). Its argmax is an exact sample of warp(logits)."""
    x = np.asarray(logits, dtype=np.float64) / params.temperature
    if params.filtered:
        x = np.where(warp(logits, params) > 0, x, -np.inf)
    return x + g


class GumbelNoise:
    """The coupled sampler's noise for one sequence: ``noise[j]`` is ``gumbel(seed, j, n_vocab)``,
    drawn once and shared by the draft and the target. ``step(start)`` is the view of one step
    (row i is position start + i) and forgets the positions before ``start``."""

    def __init__(self, seed: int, n_vocab: int) -> None:
        self.seed, self.n_vocab = int(seed), n_vocab
        self._rows: dict[int, np.ndarray] = {}

    def __getitem__(self, j: int) -> np.ndarray:
        row = self._rows.get(j)
        if row is None:
            row = self._rows[j] = gumbel(self.seed, j, self.n_vocab)
        return row

    def step(self, start: int) -> StepNoise:
        for j in [j for j in self._rows if j < start]:
            del self._rows[j]
        return StepNoise(self, start)


@dataclass(frozen=True)
class StepNoise:
    """Row i of one step's noise: the noise of output position start + i."""

    noise: GumbelNoise
    start: int

    def __getitem__(self, i: int) -> np.ndarray:
        return self.noise[self.start + i]


class PerturbedRows:
    """``perturb(logits[i], params, noise[i])`` a row at a time, on first use (as WarpedRows): the
    rows the greedy rule reads under the coupled sampler."""

    def __init__(self, logits: np.ndarray, params: SamplingParams, noise: StepNoise) -> None:
        self.logits, self.params, self.noise = logits, params, noise
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, i: int) -> np.ndarray:
        i = range(len(self.logits))[i]
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = perturb(self.logits[i], self.params, self.noise[i])
        return row
