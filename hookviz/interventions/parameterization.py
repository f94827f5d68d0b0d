"""Image parameterisations for feature visualisation: pixels or a scaled Fourier spectrum, with decorrelated colour.

The conventions of Lucid / lucent (Olah et al., "Feature Visualization", Distill 2017, section "Preconditioning and
Parameterization"): the image is ``sigmoid(colour(spatial))``; the spatial part is either raw values (``fft=False``)
or the inverse real FFT of a spectrum whose every frequency f is scaled by ``1 / max(f, 1 / max(h, w))`` (so that
all frequencies learn at similar speed, a whitened basis), divided by 4; the colour part maps decorrelated channels
to RGB through the square root of ImageNet's colour covariance, normalised by its largest column norm. Parameters
start as Gaussian noise of standard deviation 0.01, drawn from the given generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["COLOR_CORRELATION_SVD_SQRT", "ImageParam", "color_matrix", "fft_frequencies", "fft_scale"]

# the square root of ImageNet's RGB covariance (via SVD), as published with Lucid
COLOR_CORRELATION_SVD_SQRT = ((0.26, 0.09, 0.02), (0.27, 0.00, -0.05), (0.27, -0.09, 0.03))


def color_matrix() -> Tensor:
    """(3, 3): `COLOR_CORRELATION_SVD_SQRT` divided by its largest column norm (RGB = matrix @ decorrelated)."""
    m = torch.tensor(COLOR_CORRELATION_SVD_SQRT, dtype=torch.float32)
    return m / m.norm(dim=0).max()


def fft_frequencies(h: int, w: int) -> Tensor:
    """(h, w') radial frequencies of a real 2-D FFT of an h x w image; w' = w // 2 + 1, plus one for odd w (the
    extra column is cut off by the inverse transform, as in Lucid)."""
    fy = torch.fft.fftfreq(h, dtype=torch.float64)[:, None]
    fx = torch.fft.fftfreq(w, dtype=torch.float64)[: w // 2 + (2 if w % 2 else 1)]
    return (fx * fx + fy * fy).sqrt()


def fft_scale(h: int, w: int, decay_power: float = 1.0) -> Tensor:
    """(h, w') float32: the scale of each frequency, ``1 / max(f, 1 / max(h, w)) ** decay_power``."""
    return (1.0 / fft_frequencies(h, w).clamp(min=1.0 / max(h, w)) ** decay_power).float()


class ImageParam:
    """A batch of `batch` RGB images of h x w, parameterised as described in the module docs.

    ``param()`` returns the (batch, 3, h, w) image in (0, 1); `parameters` are the tensors to optimise.
    """

    def __init__(
        self,
        batch: int,
        h: int,
        w: int,
        *,
        fft: bool = True,
        decorrelate: bool = True,
        sd: float = 0.01,
        decay_power: float = 1.0,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.batch, self.h, self.w, self.fft, self.decorrelate = batch, h, w, fft, decorrelate
        if fft:
            freqs = fft_frequencies(h, w)
            shape: tuple[int, ...] = (batch, 3, *freqs.shape, 2)  # real and imaginary parts
            self.scale = fft_scale(h, w, decay_power).to(device)[None, None, ..., None]
        else:
            shape = (batch, 3, h, w)
        self.raw = (torch.randn(shape, generator=generator) * sd).to(device).requires_grad_()
        self.color = color_matrix().to(device)

    @property
    def parameters(self) -> list[Tensor]:
        return [self.raw]

    def spatial(self) -> Tensor:
        """(batch, 3, h, w) pre-colour, pre-sigmoid values."""
        if not self.fft:
            return self.raw
        spectrum = torch.view_as_complex(self.scale * self.raw)
        image = torch.fft.irfftn(spectrum, s=(self.h, self.w), norm="ortho")
        return image[:, :, : self.h, : self.w] / 4.0  # Lucid's constant: less saturated images

    def __call__(self) -> Tensor:
        image = self.spatial()
        if self.decorrelate:
            image = torch.einsum("ij,bjhw->bihw", self.color, image)
        return torch.sigmoid(image)

    def __repr__(self) -> str:
        kind = "fft" if self.fft else "pixel"
        return f"ImageParam({self.batch}x3x{self.h}x{self.w}, {kind}, decorrelate={self.decorrelate})"
