"""Numbers in a report's script files: an array's bytes as byte planes (byte 0 of every element, then byte 1, ...),
deflated with zlib and base64-encoded, which the page inflates with the browser's ``DecompressionStream``.

Byte planes because the bytes of one significance repeat far more than a whole element does (the high bytes of a
map's 16-bit codes, the sign and exponent bytes of a float): deflate finds them. The array's own dtype fixes the
byte order of the planes: the maps' codes are stored big-endian (high bytes first), the scores little-endian.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np


def pack(values: np.ndarray, level: int) -> str:
    """`values` (any shape, any fixed-size dtype with an explicit byte order) as deflated byte planes, base64."""
    raw = np.ascontiguousarray(values).reshape(-1)
    planes = raw.view("u1").reshape(-1, raw.itemsize).T.tobytes()
    return base64.b64encode(zlib.compress(planes, level)).decode("ascii")


def unpack(z: str, dtype: str) -> np.ndarray:
    """The inverse of `pack`: a flat array of `dtype` (e.g. ``"<f4"``, ``">u2"``), bit for bit."""
    planes = np.frombuffer(zlib.decompress(base64.b64decode(z)), dtype="u1")
    size = np.dtype(dtype).itemsize
    return planes.reshape(size, -1).T.copy().view(dtype).reshape(-1)
