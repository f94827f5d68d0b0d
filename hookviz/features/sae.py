"""`SAE`: a sparse autoencoder of a layer's activations, its three activation forms, and its files.

Conventions (SAELens's, so that its saved SAEs load as they are): ``W_enc`` (d_in, d_sae), ``W_dec`` (d_sae, d_in),
``b_enc`` (d_sae,), ``b_dec`` (d_in,), and for JumpReLU ``threshold`` (d_sae,). Row i of ``W_dec`` is latent i's
decoder direction (a *column* of the decoder matrix in the papers' notation x̂ = W_dec f + b_dec).

    f  = act((x - b_dec) @ W_enc + b_enc)        (..., d_in) -> (..., d_sae)
    x̂  = f @ W_dec + b_dec                       (..., d_sae) -> (..., d_in)

with act one of:

- ``"relu"``: ReLU; trained with an L1 penalty weighted by the decoder norms, sum_i f_i ||W_dec[i]|| (Bricken et al.
  2023, "Towards Monosemanticity"; Anthropic's April 2024 update).
- ``"topk"``: the k largest pre-activations kept, then ReLU, the rest zero (Gao et al. 2024, "Scaling and evaluating
  sparse autoencoders"); at most k latents fire, exactly k when k pre-activations are positive.
- ``"jumprelu"``: z * (z > threshold), one threshold per latent (Rajamanoharan et al. 2024, "Jumping Ahead: Improving
  Reconstruction Fidelity with JumpReLU Sparse Autoencoders").

Files: ``sae.save(folder)`` writes ``sae_weights.safetensors`` and ``cfg.json`` (SAELens's file names and keys, with
``architecture`` "standard" / "topk" / "jumprelu"); `SAE.load` reads hookviz's folders and SAELens's alike. Nothing is
ever unpickled: safetensors hold plain tensors. A ``.pt`` file is read only with ``allow_pickle=True``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from .._checks import positive_int

__all__ = ["ACTIVATIONS", "SAE", "SAEConfigError"]

ACTIVATIONS: tuple[str, ...] = ("relu", "topk", "jumprelu")
CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
# SAELens's "architecture" names -> ours ("standard" is its ReLU SAE)
_ARCH_TO_ACT = {"standard": "relu", "relu": "relu", "topk": "topk", "jumprelu": "jumprelu"}
_ACT_TO_ARCH = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class SAEConfigError(ValueError):
    """A saved SAE whose config is missing, unreadable or does not match its weights."""


class SAE(nn.Module):
    """A sparse autoencoder: ``encode`` x (..., d_in) -> f (..., d_sae), ``decode`` f -> x̂ (..., d_in),
    ``forward`` x -> (x̂, f). See the module docstring for the formulas, the weight layout and the citations.

    Args:
        d_in: the width of the layer's activations.
        d_sae: the number of latents.
        act: ``"relu"``, ``"topk"`` or ``"jumprelu"``.
        k: latents kept per input (``"topk"`` only).
        dtype, device: of the parameters.

    A fresh SAE has random unit-norm decoder rows, ``W_enc = W_dec.T`` (tied initialisation, Gao et al. 2024 §A.1),
    zero biases and zero thresholds; `hookviz.features.train_sae` trains it.
    """

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        act: str = "relu",
        *,
        k: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        positive_int("d_in", d_in, "the layer's width")
        positive_int("d_sae", d_sae, "the number of latents")
        if act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {', '.join(map(repr, ACTIVATIONS))}, got {act!r}")
        if act == "topk":
            if k is None:
                raise ValueError("act='topk' needs k=<latents kept per input>")
            positive_int("k", k, "latents kept per input")
            if k > d_sae:
                raise ValueError(f"k must be <= d_sae ({d_sae}), got {k}")
        elif k is not None:
            raise ValueError(f"k is for act='topk' only; act is {act!r}")
        self.d_in, self.d_sae, self.act, self.k = d_in, d_sae, act, k
        w_dec = torch.randn(d_sae, d_in, dtype=torch.float32)
        w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
        kw: dict[str, Any] = {"dtype": dtype, "device": device}
        self.W_enc = nn.Parameter(w_dec.T.contiguous().to(**kw))  # row-major, as loaded weights are
        self.W_dec = nn.Parameter(w_dec.to(**kw))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, **kw))
        self.b_dec = nn.Parameter(torch.zeros(d_in, **kw))
        if act == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(d_sae, **kw))

    # -- the model -----------------------------------------------------------------------------------------------
    def pre_activations(self, x: Tensor) -> Tensor:
        """z = (x - b_dec) @ W_enc + b_enc, (..., d_in) -> (..., d_sae)."""
        self._check_input(x)
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    def activate(self, z: Tensor) -> Tensor:
        """act(z) for pre-activations z (..., d_sae)."""
        if self.act == "relu":
            return torch.relu(z)
        if self.act == "topk":
            top = z.topk(self.k, dim=-1)  # type: ignore[arg-type]
            return torch.zeros_like(z).scatter(-1, top.indices, torch.relu(top.values))
        return z * (z > self.threshold).to(z.dtype)

    def encode(self, x: Tensor) -> Tensor:
        """Latents f (..., d_sae) of activations x (..., d_in)."""
        return self.activate(self.pre_activations(x))

    def decode(self, f: Tensor) -> Tensor:
        """Reconstruction x̂ = f @ W_dec + b_dec, (..., d_sae) -> (..., d_in)."""
        if f.shape[-1] != self.d_sae:
            raise ValueError(f"latents must end in d_sae = {self.d_sae}, got shape {tuple(f.shape)}")
        return f @ self.W_dec + self.b_dec

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(x̂, f) for activations x (..., d_in)."""
        f = self.encode(x)
        return self.decode(f), f

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a tensor (..., d_in), got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.d_in:
            raise ValueError(
                f"the SAE reads activations of width d_in = {self.d_in}; got a tensor of shape {tuple(x.shape)}"
            )

    def check_latent(self, index: object) -> int:
        """`index` as a latent number in [0, d_sae); an error naming the range otherwise."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"a latent index must be an int, got {type(index).__name__} {index!r}")
        if not 0 <= index < self.d_sae:
            raise IndexError(f"latent index {index} is out of range: this SAE has d_sae = {self.d_sae} latents")
        return index

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Scale every decoder row (latent direction) to unit norm, in place."""
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(torch.finfo(self.W_dec.dtype).tiny))

    def extra_repr(self) -> str:
        k = f", k={self.k}" if self.act == "topk" else ""
        return f"d_in={self.d_in}, d_sae={self.d_sae}, act={self.act!r}{k}"

    # -- files ---------------------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The JSON config: SAELens's field names (``architecture``, ``d_in``, ``d_sae``, ``dtype``, ``k``)."""
        dtype = next(k for k, v in _DTYPES.items() if v == self.W_dec.dtype)
        cfg: dict[str, Any] = {
            "architecture": _ACT_TO_ARCH[self.act],
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": dtype,
            "apply_b_dec_to_input": True,
            "normalize_activations": "none",
            "format": "hookviz.SAE/1",
        }
        if self.act == "topk":
            cfg["k"] = self.k
        return cfg

    def save(self, folder: str | Path) -> Path:
        """Write ``cfg.json`` and ``sae_weights.safetensors`` into `folder` (made if missing); returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {n: p.detach().contiguous().cpu() for n, p in self.named_parameters()}
        save_file(tensors, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps(self.config(), indent=2) + "\n")
        return folder

    @classmethod
    def load(
        cls,
        folder: str | Path,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        allow_pickle: bool = False,
    ) -> SAE:
        """Read an SAE saved by `save` or by SAELens (``SAE.save_model``): ``cfg.json`` + ``sae_weights.safetensors``.

        SAELens configs: ``architecture`` "standard" (ReLU), "topk" (with ``k``, or an older
        ``activation_fn_str`` "topk" with ``activation_fn_kwargs.k``) or "jumprelu" (with a ``threshold`` tensor).
        ``apply_b_dec_to_input`` false is honoured: SAELens's encoder then reads x, not x - b_dec, the same map as
        ours with b_enc + b_dec @ W_enc as the encoder bias, which is what is loaded. Other settings (gated SAEs,
        activation normalisation) raise `SAEConfigError` rather than load as something else. A folder holding only
        a ``.pt`` / ``.pth`` state dict is refused unless ``allow_pickle=True`` (unpickling runs code; even then
        ``torch.load(weights_only=True)``).
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"no SAE folder at {str(folder)!r}")
        cfg_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
        if not cfg_path.is_file():
            raise SAEConfigError(
                f"{str(folder)!r} has no {CONFIG_FILE}: an SAE folder holds {CONFIG_FILE} (architecture, d_in, d_sae, "
                f"k for topk) next to {WEIGHTS_FILE}"
            )
        try:
            cfg = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise SAEConfigError(f"{str(cfg_path)!r} is not valid JSON: {err}") from err
        if not isinstance(cfg, dict):
            raise SAEConfigError(f"{str(cfg_path)!r} must hold a JSON object, got {type(cfg).__name__}")
        if weights_path.is_file():
            tensors = load_file(str(weights_path), device="cpu")
        else:
            pickles = sorted(p for p in folder.iterdir() if p.suffix in (".pt", ".pth", ".bin", ".ckpt"))
            if not pickles:
                raise FileNotFoundError(f"{str(folder)!r} has no {WEIGHTS_FILE}")
            if not allow_pickle:
                raise ValueError(
                    f"{str(folder)!r} holds {pickles[0].name}, a pickle (loading one runs code it contains): refused. "
                    f"Convert it to {WEIGHTS_FILE}, or pass allow_pickle=True if you trust its source"
                )
            tensors = torch.load(pickles[0], map_location="cpu", weights_only=True)
            if not isinstance(tensors, dict):
                raise SAEConfigError(f"{pickles[0].name} must hold a state dict of tensors")
        return cls._from_parts(cfg, tensors, str(folder), device=device, dtype=dtype)

    @classmethod
    def _from_parts(
        cls,
        cfg: dict[str, Any],
        tensors: dict[str, Tensor],
        where: str,
        *,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> SAE:
        def bad(msg: str) -> SAEConfigError:
            return SAEConfigError(f"SAE at {where!r}: {msg}")

        arch = cfg.get("architecture")
        act_str = cfg.get("activation_fn_str", cfg.get("activation_fn"))
        if arch is None and act_str is None:
            arch = "standard"  # SAELens before v4 wrote no architecture: its SAEs were ReLU ones
        if arch in (None, "standard") and act_str == "topk":
            arch = "topk"
        if arch not in _ARCH_TO_ACT:
            raise bad(f"architecture {arch!r} is not supported (supported: standard (ReLU), topk, jumprelu)")
        act = _ARCH_TO_ACT[arch]
        if act == "relu" and act_str not in (None, "relu"):
            raise bad(f"activation_fn {act_str!r} is not supported for a standard SAE (only relu)")
        for key in ("d_in", "d_sae"):
            v = cfg.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(f"config field {key!r} must be an int >= 1, got {v!r}")
        d_in, d_sae = cfg["d_in"], cfg["d_sae"]
        norm = cfg.get("normalize_activations", "none")
        if norm not in (None, "none"):
            raise bad(
                f"normalize_activations = {norm!r}: activations normalised at run time are not supported; "
                "fold the scaling into the weights first"
            )
        if cfg.get("rescale_acts_by_decoder_norm", False):
            # SAELens's TopK option: the latents are chosen and scaled by W_enc's columns times the decoder rows'
            # norms; loaded as a plain TopK it would compute another map, silently
            raise bad(
                "rescale_acts_by_decoder_norm = true is not supported: fold the decoder norms into W_enc, b_enc and "
                "W_dec first (SAELens's fold_W_dec_norm) and save it again"
            )
        k = None
        if act == "topk":
            k = cfg.get("k", (cfg.get("activation_fn_kwargs") or {}).get("k"))
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_sae:
                raise bad(f"a topk SAE needs an int k in [1, d_sae = {d_sae}] in its config, got {k!r}")
        expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
        if act == "jumprelu":
            if "threshold" not in tensors and "log_threshold" in tensors:
                tensors = {**tensors, "threshold": tensors["log_threshold"].exp()}
            expected["threshold"] = (d_sae,)
        missing = [n for n in expected if n not in tensors]
        if missing:
            raise bad(f"the weights lack {', '.join(missing)} (found {', '.join(sorted(tensors))})")
        for name, shape in expected.items():
            if tuple(tensors[name].shape) != shape:
                raise bad(
                    f"{name} has shape {tuple(tensors[name].shape)} but the config (d_in = {d_in}, d_sae = {d_sae}) "
                    f"says {shape}"
                )
        if dtype is None:
            dtype = _DTYPES.get(str(cfg.get("dtype", "float32")).removeprefix("torch."), tensors["W_dec"].dtype)
        sae = cls(d_in, d_sae, act, k=k, dtype=dtype, device=device)
        state = {n: tensors[n] for n in expected}
        if cfg.get("apply_b_dec_to_input", True) is False:
            # SAELens's encoder then reads x, not x - b_dec: the same map as ours with b_enc + b_dec @ W_enc
            state["b_enc"] = tensors["b_enc"].float() + tensors["b_dec"].float() @ tensors["W_enc"].float()
        sae.load_state_dict({n: t.to(dtype) for n, t in state.items()})
        return sae
