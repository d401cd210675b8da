"""All randomness of the decoding loop, drawn on the device the probabilities live on.

One `Sampler` per generation, seeded per prompt (pipeline.generation.example_seed), so a run is
reproducible on a given device. Its torch.Generator is created on the sampler's device (the device
of the target's logits), because PyTorch refuses a CPU generator for a CUDA tensor; a tensor on
any other device is refused with one clear line on every device, CPU included, so a mistake shows
in CPU tests too. A component whose tensors live elsewhere (a separate drafter on another GPU)
asks for `for_device(d)`: a sampler on d, seeded from the prompt seed and d. Never the same seed: two
CUDA devices run the same Philox stream from equal seeds, so a drafter on cuda:1 would draw its tokens
with the very uniforms the target's verification draws on cuda:0, coupling draft and check (exact-match
verification would accept more than its protocol does; rejection sampling would lose its losslessness).

Draws return device tensors; the caller moves what it needs to the host once per step
(`decoding.engine.transfer.to_host`), never per token or per node. Categorical draws use the inverse CDF (cumsum +
searchsorted, in float64 so that no tail entry is lost to rounding): on this CPU it is 20-40x
faster than torch.multinomial on a 49k-152k vocabulary, which generates one exponential per
vocabulary entry, and it is the same few kernels on a GPU. A loop that samples small rows one
after another (the Domino chain over its candidate pool) draws a round's Gumbel noise at once
instead (`gumbel`): one add and one argmax per position.
"""

from __future__ import annotations

import zlib

import torch

from decoding.engine.argmax import row_argmax


class Sampler:
    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.seed = int(seed)
        self.device = torch.device(device)
        self._generator: torch.Generator | None = None  # created at the first draw (no CUDA needed before)
        self._others: dict = {}  # per device, and named streams

    @property
    def generator(self) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator(device=self.device).manual_seed(self.seed)
        return self._generator

    def for_device(self, device: torch.device | str) -> "Sampler":
        device = torch.device(device)
        if _same_device(device, self.device):
            return self
        if device not in self._others:
            self._others[device] = Sampler(_derived_seed(self.seed, f"device:{device}"), device)
        return self._others[device]

    def stream(self, name: str) -> "Sampler":
        """An independent stream on the same device, seeded from (seed, name): draws a method makes
        for its own decisions (VIA-SD's slim tier) then leave the main stream, and hence the
        tokens the shared verification draws, exactly as they are without them."""
        key = f"stream:{name}"
        if key not in self._others:
            self._others[key] = Sampler(_derived_seed(self.seed, name), self.device)
        return self._others[key]

    def check(self, tensor: torch.Tensor) -> None:
        if not _same_device(tensor.device, self.device):
            raise ValueError(f"sampling a tensor on {tensor.device} with a sampler for {self.device}; "
                             f"use sampler.for_device({str(tensor.device)!r})")

    def uniform(self, shape: int | tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """U[0, 1) on the sampler's device."""
        return torch.rand(shape, generator=self.generator, device=self.device, dtype=dtype)

    def gumbel(self, shape: int | tuple[int, ...]) -> torch.Tensor:
        """Gumbel(0, 1) noise in float64 on the sampler's device: argmax(logits / T + g) is a draw from
        softmax(logits / T) (the Gumbel-max trick), so a loop that samples position after position (the
        Domino chain) draws its whole round's noise at once and pays one add and one argmax per position,
        its distributions taken after the loop in one softmax. float64: float32 uniforms would cap g at
        ~16.6 and never draw a token whose odds are below ~e^-17 of the best (at most ~0.6% of the mass
        of a 152k vocabulary); with float64 the cap is ~36.7. u = 0 gives -inf: never drawn."""
        return self.uniform(shape, torch.float64).log_().neg_().log_().neg_()

    def categorical(self, probs: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
        """One index per row of `probs` ([V] -> scalar, [n, V] -> [n]); rows need not be normalised
        (a zero row is not allowed). Inverse CDF: the first index whose running sum exceeds u * total.
        `uniform`: the rows' U[0, 1) draws in float64 ([n] or [n, 1], or one for a [V] row), taken
        from `uniform()` beforehand by a loop that samples position after position (a drafter's chain,
        `ChainDraws`): one draw per step instead of one per position."""
        self.check(probs)
        if uniform is None:
            uniform = self.uniform((*probs.shape[:-1], 1), torch.float64)
        elif uniform.dim() != 0:  # a 0-dim draw scales a [V] row's total as it is
            uniform = uniform.view(*probs.shape[:-1], 1)
        return categorical(probs, uniform)


class ChainDraws:
    """The draws of a drafted chain, position after position (a drafter's γ drafts, each fed back before
    the next): at T > 0 the chain's uniforms are drawn at once and each position is an inverse-CDF draw
    from softmax(logits / T), whose row is kept; at T = 0 each position is the argmax and its logits are
    kept, turned into T = 1 distributions by one softmax after the loop, and only if asked. Shared by
    the drafter loops over a whole vocabulary (decoding/drafting/drafter.py, eagle3_chain.py); the Domino
    chain, whose rows are small, draws by Gumbel-max instead (`gumbel`)."""

    def __init__(self, sampler: Sampler | None, length: int, temperature: float,
                 uniforms: torch.Tensor | None = None):
        """`uniforms`: the chain's [length] float64 draws, made beforehand (inside a CUDA graph they are its
        input, `eagle3_chain.draft_chain`; no sampler then); else drawn here from `sampler`."""
        self.sampler, self.temperature = sampler, temperature
        self.sampled = temperature > 0
        if self.sampled and uniforms is None:
            uniforms = sampler.uniform(length, torch.float64)
        # one draw for the chain, its 0-dim views made at once (not one index per position)
        self.uniforms = uniforms.unbind(0) if self.sampled else None
        self.rows: list[torch.Tensor] = []  # the distributions (T > 0) or the logits (T = 0)

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The next position's token (a device scalar) from its logits [V]."""
        if not self.sampled:
            self.rows.append(logits)
            return row_argmax(logits)
        self.rows.append(probabilities(logits, self.temperature))
        if self.sampler is not None:
            self.sampler.check(self.rows[-1])
        return categorical(self.rows[-1], self.uniforms[len(self.rows) - 1])

    def distributions(self, needed: bool = True) -> torch.Tensor | None:
        """[n, V]: the rows the draws came from (T > 0; T = 0: the T = 1 softmax of the logits, or None
        when not `needed`)."""
        if self.sampled:
            return torch.stack(self.rows)
        return probabilities(torch.stack(self.rows), self.temperature) if needed else None


def _derived_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    # "cuda" and "cuda:0" name the same device when the current device is 0
    return a.index is None or b.index is None or a.index == b.index


def categorical(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """`Sampler.categorical` with its uniforms given (a pure function of tensors: a CUDA graph can hold it):
    `uniform` float64, 0-dim for a [V] row or [..., 1]."""
    # float64: a float32 running sum stops growing for entries below ~3e-8 once it passes 0.5 (they
    # could never be drawn) and rounds every other entry to steps of ~6e-8
    cdf = probs.cumsum(-1, dtype=torch.float64)  # [..., V]
    picked = torch.searchsorted(cdf, uniform * cdf[..., -1:], right=True)  # [..., 1]
    return picked.clamp_max_(probs.shape[-1] - 1).squeeze(-1)


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32; T = 0 gives the T = 1 distribution (for rules that need one)."""
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.softmax(logits, dim=-1, dtype=torch.float32)
