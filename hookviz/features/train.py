"""`train_sae`: train a sparse autoencoder on a layer's activations, streamed through hooks.

The data go through the model batch by batch; a forward hook (one `HookManager`) takes the layer's output and stops
the forward there (the rest of the model is not run). The activation rows go into a buffer of `buffer_size` rows
that is shuffled when it is refilled: half of it is served as training batches, half is kept and mixed with the next
data (as SAELens's activation store), so a batch mixes many inputs and the data set is never held in memory whole.

Objective per batch of rows x (B, d_in), MSE summed over d_in and averaged over rows, plus:

- ``"relu"``: ``l1_coeff * sum_i f_i ||W_dec[i]||`` (Bricken et al. 2023; the decoder-norm weighting of Anthropic's
  April 2024 update). Dead latents (no activation in the last `dead_after` rows) are resampled every
  `resample_every` steps as in Bricken et al. 2023: the decoder row becomes a batch row (minus b_dec) drawn with
  probability proportional to its squared reconstruction error, normalised; the encoder column that direction times
  0.2 times the mean norm of the live encoder columns; b_enc 0; their Adam moments reset.
- ``"topk"``: ``aux_coeff * AuxK`` (Gao et al. 2024, §A.2): the top ``d_in // 2`` pre-activations among dead latents
  reconstruct the residual x - x̂ (detached); the loss is scaled by min(dead / k_aux, 1) as in SAELens; aux_coeff
  defaults to 1/32 (Gao et al.).
- ``"jumprelu"``: ``l0_coeff * L0`` with the straight-through estimators of Rajamanoharan et al. 2024 (rectangle
  kernel of width `bandwidth`) for the threshold's gradient; thresholds kept >= 0.

Adam; after each step the decoder rows (latent directions) are rescaled to unit norm, and before it their gradient's
component parallel to each row is removed (Bricken et al. 2023), so that the step does not fight the constraint.

Resumable: with `checkpoint_dir` the SAE, Adam's state, the buffer (rows served and kept), the data position, the
shuffling generator, the dead-latent counters and the loss history are written every `checkpoint_every` steps and at
the end (safetensors + JSON, no pickle). A later call with the same arguments and a larger `steps` continues from
there and gives the same SAE, bit for bit, as an uninterrupted run (the data must come in the same order on each
pass: a tensor, a list, a DataLoader without shuffling, or a seeded one).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from .._checks import number_at_least, positive_int
from .._progress import progress_bar
from ..hooks import HookManager
from ..interventions._common import parse_key, prepared
from ._acts import Select, _Stop, batches, first_tensor, model_device, model_inputs, rows_of
from .sae import SAE

__all__ = ["SAETraining", "train_sae"]

STATE_FILE = "train_state.safetensors"
META_FILE = "train_state.json"


@dataclass
class SAETraining:
    """What `train_sae` made: the SAE, the loss and L0 of every step (tensors (steps,)), and the speed of this call
    (rows of activations per second, the rows being tokens for a language model)."""

    sae: SAE
    loss: Tensor
    l0: Tensor
    steps: int
    rows: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.nan


class _Stream:
    """Batches of `data` by position, cycling over passes; `skip` moves on without running the model."""

    def __init__(self, data: Any, batch_size: int) -> None:
        self.data, self.batch_size, self.position = data, batch_size, 0
        self._it: Iterator[Any] | None = None
        self._first_pass = True

    def _restart(self) -> None:
        if self._it is not None and iter(self.data) is self.data:
            raise ValueError(
                f"data ran out after {self.position} batches and is a one-shot iterator: pass a re-iterable (a tensor, "
                "a list, a DataLoader) or fewer steps"
            )
        self._it = batches(self.data, self.batch_size)

    def next(self) -> Any:
        if self._it is None:
            self._restart()
        for _ in range(2):
            try:
                item = next(self._it)  # type: ignore[arg-type]
                self.position += 1
                return item
            except StopIteration:
                if self.position == 0:
                    break
                self._restart()
        raise ValueError("data holds no batch")

    def skip(self, n: int) -> None:
        for _ in range(n):
            self.next()


class _Buffer:
    """Activation rows shuffled across batches: `pending` rows are served in order, `reserve` rows wait to be mixed
    with the next data."""

    def __init__(self, fetch: Any, capacity: int, generator: torch.Generator, d_in: int, device: torch.device) -> None:
        self.fetch, self.capacity, self.generator = fetch, capacity, generator
        self.pending = torch.empty(0, d_in, device=device)
        self.reserve = torch.empty(0, d_in, device=device)

    def refill(self) -> None:
        parts, count = [self.reserve], self.reserve.shape[0]
        while count < self.capacity:
            rows = self.fetch()
            parts.append(rows)
            count += rows.shape[0]
        rows = torch.cat(parts)
        perm = torch.randperm(rows.shape[0], generator=self.generator).to(rows.device)
        rows = rows[perm]
        half = rows.shape[0] // 2
        self.pending = torch.cat([self.pending, rows[:half]])
        self.reserve = rows[half:]

    def take(self, n: int) -> Tensor:
        while self.pending.shape[0] < n:
            self.refill()
        out, self.pending = self.pending[:n], self.pending[n:]
        return out


class _JumpReLU(torch.autograd.Function):
    """z * H(z - θ); d/dθ by the straight-through estimator -(θ/ε) K((z - θ)/ε), K = 1{|u| < 1/2}
    (Rajamanoharan et al. 2024, eq. 11)."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return z * (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        z, theta = ctx.saved_tensors
        kernel = ((z - theta).abs() < ctx.eps / 2).to(z.dtype) / ctx.eps
        grad_theta = (-(theta * kernel) * g).reshape(-1, z.shape[-1]).sum(0)
        return g * (z > theta).to(z.dtype), grad_theta, None


class _Step(torch.autograd.Function):
    """H(z - θ), with d/dθ = -(1/ε) K((z - θ)/ε) (Rajamanoharan et al. 2024, eq. 12): the L0 penalty's gradient."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        z, theta = ctx.saved_tensors
        kernel = ((z - theta).abs() < ctx.eps / 2).to(z.dtype) / ctx.eps
        return None, (-kernel * g).reshape(-1, z.shape[-1]).sum(0), None


def train_sae(
    model: nn.Module,
    layer: str,
    data: Any,
    *,
    d_sae: int,
    act: str = "topk",
    k: int | None = None,
    steps: int = 1000,
    batch_size: int = 1024,
    lr: float = 4e-4,
    l1_coeff: float = 1.0,
    aux_coeff: float = 1 / 32,
    l0_coeff: float = 1e-3,
    bandwidth: float = 1e-3,
    dead_after: int = 100_000,
    resample_every: int | None = None,
    buffer_size: int | None = None,
    data_batch_size: int = 32,
    select: Select | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> SAETraining:
    """Train an `SAE` of `layer`'s outputs on `data` fed through `model`; see the module docstring for the losses.

    Args:
        model: any module; its training mode, frozen flags and hooks come back as they were. The SAE is made on its
            device (in float32).
        layer: the module whose output is read (its first tensor for a tuple output).
        data: a tensor (N, ...) of model inputs (token ids (N, T) for a language model, images (N, C, H, W)), split
            into batches of `data_batch_size`, or an iterable of batches (tensors, ``(inputs, labels)`` pairs, dicts
            of keyword arguments; an ``attention_mask`` keeps padding out). Cycled through as often as needed.
        d_sae, act, k: the SAE's width, activation (``"relu"``, ``"topk"``, ``"jumprelu"``) and k for TopK.
        steps, batch_size, lr: Adam steps, activation rows per step, learning rate.
        l1_coeff, aux_coeff, l0_coeff, bandwidth: the sparsity terms (module docstring).
        dead_after: a latent that has not fired in this many rows is dead (AuxK, resampling).
        resample_every: ReLU only; steps between resamplings of dead latents (default 500; 0: never).
        buffer_size: rows in the shuffling buffer (default 16 batches).
        select: the output -> rows rule, when the default (2-D as it is, (N, T, D) tokens, (N, C, H, W) channels)
            is not wanted.
        checkpoint_dir, checkpoint_every: where and how often (steps; default: only at the end) to checkpoint; an
            existing checkpoint there is resumed.
        seed: seeds the initialisation, the shuffling and the resampling.
        progress: a progress bar with the loss and L0.

    Returns an `SAETraining`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    name, _ = parse_key(model, layer, "layer")
    positive_int("d_sae", d_sae, "the number of latents")
    positive_int("steps", steps, "optimizer steps")
    positive_int("batch_size", batch_size, "activation rows per step")
    positive_int("data_batch_size", data_batch_size, "inputs per forward")
    positive_int("dead_after", dead_after, "rows without firing before a latent counts as dead")
    number_at_least("lr", lr, 0.0, "learning rate")
    for nm, v in (("l1_coeff", l1_coeff), ("aux_coeff", aux_coeff), ("l0_coeff", l0_coeff)):
        number_at_least(nm, v, 0.0, "a loss coefficient")
    number_at_least("bandwidth", bandwidth, 1e-12, "the JumpReLU kernel width")
    buffer_size = 16 * batch_size if buffer_size is None else buffer_size
    positive_int("buffer_size", buffer_size, "rows in the shuffling buffer")
    if buffer_size < 2 * batch_size:
        raise ValueError(f"buffer_size must be >= 2 * batch_size = {2 * batch_size}, got {buffer_size}")
    if resample_every is None:
        # a fixed default, not a fraction of `steps`: a resumed run (larger steps) must resample at the same steps
        resample_every = 500 if act == "relu" else 0
    device = model_device(model)
    gen = torch.Generator().manual_seed(seed)
    stream = _Stream(data, data_batch_size)
    captured: list[Tensor] = []
    mask_box: list[Tensor | None] = [None]

    def capture(module: nn.Module, args: Any, output: Any) -> None:
        tensor = first_tensor(output)
        if tensor is None:
            raise TypeError(f"{name!r} returned {type(output).__name__}, not a tensor (or a tuple starting with one)")
        captured.append(rows_of(tensor.detach(), select, mask_box[0], name).float())
        raise _Stop

    def fetch() -> Tensor:
        args, kwargs = model_inputs(stream.next(), device)
        mask_box[0] = kwargs.get("attention_mask")
        captured.clear()
        try:
            model(*args, **kwargs)
        except _Stop:
            pass
        if not captured:
            raise ValueError(f"layer {name!r} did not run in the model's forward: no activations to train on")
        return captured.pop()

    with prepared(model, True, freeze=True), torch.no_grad(), HookManager(model) as hooks:
        hooks.forward(name, capture)
        first = fetch()  # the first batch tells the width; its rows go into the buffer
    d_in = first.shape[-1]

    sae = SAE(d_in, d_sae, act, k=k, device=device)
    with torch.no_grad():
        w = torch.randn(d_sae, d_in, generator=gen).to(device)
        w /= w.norm(dim=1, keepdim=True)
        sae.W_dec.copy_(w)
        sae.W_enc.copy_(w.T)
        if act == "jumprelu":
            sae.threshold.fill_(bandwidth)  # a small positive start (SAELens: 0.001), moved by the STE
    opt = torch.optim.Adam(sae.parameters(), lr=lr)
    buffer = _Buffer(fetch, buffer_size, gen, d_in, device)
    buffer.reserve = first
    since_fired = torch.zeros(d_sae, dtype=torch.long, device=device)
    losses: list[Tensor] = []
    l0s: list[Tensor] = []
    start = 0
    hyper = {
        "layer": name, "d_in": d_in, "d_sae": d_sae, "act": act, "k": k, "batch_size": batch_size, "lr": lr,
        "l1_coeff": l1_coeff, "aux_coeff": aux_coeff, "l0_coeff": l0_coeff, "bandwidth": bandwidth,
        "dead_after": dead_after, "resample_every": resample_every, "buffer_size": buffer_size,
        "data_batch_size": data_batch_size, "seed": seed,
    }  # fmt: skip
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt is not None and (ckpt / META_FILE).is_file():
        if iter(data) is data:
            raise ValueError(
                "resuming needs data that can be read again from its start (a tensor, a list, a DataLoader)"
            )
        stream = _Stream(data, data_batch_size)  # from the start: the checkpoint's position is skipped to
        start = _load_checkpoint(ckpt, hyper, sae, opt, buffer, gen, since_fired, losses, l0s, stream)
        if start > steps:
            raise ValueError(f"the checkpoint at {str(ckpt)!r} is at step {start}, past steps = {steps}")
    every = checkpoint_every if checkpoint_every is not None else steps
    positive_int("checkpoint_every", every, "steps between checkpoints")

    bar = progress_bar(total=steps, initial=start, enabled=progress, desc=f"SAE on {name}")
    rows_seen, began = 0, time.perf_counter()
    with prepared(model, True, freeze=True), HookManager(model) as hooks:
        hooks.forward(name, capture)
        for step in range(start, steps):
            with torch.no_grad():
                x = buffer.take(batch_size)
                if step == 0:
                    sae.b_dec.copy_(x.mean(0))  # centre the data (Gao et al. use the geometric median)
            loss, l0, fired = _loss(sae, x, since_fired, hyper)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            with torch.no_grad():
                # remove the gradient component along each decoder row: the step then keeps its norm to first order
                g, w = sae.W_dec.grad, sae.W_dec
                g -= (g * w).sum(1, keepdim=True) * w
            opt.step()
            with torch.no_grad():
                sae.normalize_decoder()
                if act == "jumprelu":
                    sae.threshold.clamp_(min=0.0)
                since_fired.add_(batch_size).masked_fill_(fired, 0)
                if act == "relu" and resample_every and (step + 1) % resample_every == 0 and step + 1 < steps:
                    _resample(sae, opt, x, since_fired, dead_after, gen)
            losses.append(loss.detach())
            l0s.append(l0)
            rows_seen += batch_size
            bar.update(1)
            if (step + 1) % 10 == 0 or step + 1 == steps:
                bar.set_postfix(loss=f"{loss.item():.4g}", L0=f"{l0.item():.1f}")
            if ckpt is not None and ((step + 1) % every == 0 or step + 1 == steps):
                _save_checkpoint(ckpt, hyper, step + 1, sae, opt, buffer, gen, since_fired, losses, l0s, stream)
    bar.close()
    seconds = time.perf_counter() - began
    return SAETraining(sae, torch.stack(losses).cpu(), torch.stack(l0s).cpu(), steps, rows_seen, seconds)


def _loss(sae: SAE, x: Tensor, since_fired: Tensor, hyper: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, mean L0, which latents fired) for one batch x (B, d_in)."""
    z = sae.pre_activations(x)
    act = hyper["act"]
    if act == "jumprelu":
        f = _JumpReLU.apply(z, sae.threshold, hyper["bandwidth"])
    else:
        f = sae.activate(z)
    x_hat = sae.decode(f)
    loss = (x_hat - x).pow(2).sum(-1).mean()
    active = f.detach() != 0
    if act == "relu":
        loss = loss + hyper["l1_coeff"] * (f * sae.W_dec.norm(dim=1)).sum(-1).mean()
    elif act == "jumprelu":
        loss = loss + hyper["l0_coeff"] * _Step.apply(z, sae.threshold, hyper["bandwidth"]).sum(-1).mean()
    else:
        dead = since_fired >= hyper["dead_after"]
        n_dead = int(dead.sum())
        if n_dead:
            k_aux = min(x.shape[-1] // 2, n_dead)
            scale = min(n_dead / max(x.shape[-1] // 2, 1), 1.0)
            top = z.masked_fill(~dead, -math.inf).topk(k_aux, dim=-1)
            aux = torch.zeros_like(z).scatter(-1, top.indices, top.values)
            residual = (x - x_hat).detach()
            aux_loss = (aux @ sae.W_dec - residual).pow(2).sum(-1).mean()
            loss = loss + hyper["aux_coeff"] * scale * aux_loss
    return loss, active.sum(-1).float().mean(), active.any(0)


@torch.no_grad()
def _resample(
    sae: SAE, opt: torch.optim.Optimizer, x: Tensor, since_fired: Tensor, dead_after: int, gen: torch.Generator
) -> None:
    """Bricken et al. 2023's resampling of dead latents, on the current batch (module docstring)."""
    dead = (since_fired >= dead_after).nonzero().flatten()
    if dead.numel() == 0:
        return
    err = (sae(x)[0] - x).pow(2).sum(-1)
    weights = err.square().cpu().double()
    if float(weights.sum()) <= 0:
        return
    picks = torch.multinomial(weights, dead.numel(), replacement=True, generator=gen).to(x.device)
    dirs = x[picks] - sae.b_dec
    dirs = dirs / dirs.norm(dim=1, keepdim=True).clamp_min(1e-12)
    alive = since_fired < dead_after
    enc_norm = sae.W_enc[:, alive].norm(dim=0).mean() if bool(alive.any()) else torch.tensor(1.0)
    sae.W_dec[dead] = dirs
    sae.W_enc[:, dead] = dirs.T * 0.2 * enc_norm
    sae.b_enc[dead] = 0.0
    for p, index in ((sae.W_dec, (dead,)), (sae.W_enc, (slice(None), dead)), (sae.b_enc, (dead,))):
        state = opt.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                state[key][index] = 0.0
    since_fired[dead] = 0


def _save_checkpoint(
    folder: Path,
    hyper: dict[str, Any],
    step: int,
    sae: SAE,
    opt: torch.optim.Optimizer,
    buffer: _Buffer,
    gen: torch.Generator,
    since_fired: Tensor,
    losses: list[Tensor],
    l0s: list[Tensor],
    stream: _Stream,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    sae.save(folder / "sae")
    tensors: dict[str, Tensor] = {
        "buffer.pending": buffer.pending,
        "buffer.reserve": buffer.reserve,
        "generator": gen.get_state(),
        "since_fired": since_fired,
        "loss": torch.stack(losses),
        "l0": torch.stack(l0s),
    }
    names = {p: n for n, p in sae.named_parameters()}
    for p, state in opt.state.items():
        for key, value in state.items():
            tensors[f"adam.{names[p]}.{key}"] = value
    tmp = folder / (STATE_FILE + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
    tmp.replace(folder / STATE_FILE)  # the state and its JSON written last: a crash mid-way keeps the old pair usable
    meta = {"step": step, "data_position": stream.position, "hyper": hyper}
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _load_checkpoint(
    folder: Path,
    hyper: dict[str, Any],
    sae: SAE,
    opt: torch.optim.Optimizer,
    buffer: _Buffer,
    gen: torch.Generator,
    since_fired: Tensor,
    losses: list[Tensor],
    l0s: list[Tensor],
    stream: _Stream,
) -> int:
    meta = json.loads((folder / META_FILE).read_text())
    saved = meta.get("hyper", {})
    differ = {k: (saved.get(k), v) for k, v in hyper.items() if saved.get(k) != v}
    if differ:
        raise ValueError(
            f"the checkpoint at {str(folder)!r} was made with other settings: "
            + ", ".join(f"{k} {a!r} there, {b!r} now" for k, (a, b) in differ.items())
        )
    device = sae.W_dec.device
    loaded = SAE.load(folder / "sae", device=device)
    sae.load_state_dict(loaded.state_dict())
    t = load_file(str(folder / STATE_FILE), device="cpu")
    buffer.pending, buffer.reserve = t["buffer.pending"].to(device), t["buffer.reserve"].to(device)
    gen.set_state(t["generator"])
    since_fired.copy_(t["since_fired"])
    losses.extend(t["loss"].to(device).unbind())
    l0s.extend(t["l0"].to(device).unbind())
    for n, p in sae.named_parameters():
        keys = [k for k in t if k.startswith(f"adam.{n}.")]
        if keys:
            opt.state[p] = {k.rpartition(".")[2]: t[k].to(device) if t[k].dim() else t[k] for k in keys}
    stream.skip(int(meta["data_position"]))
    return int(meta["step"])
