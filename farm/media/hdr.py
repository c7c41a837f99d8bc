"""HDR decodes: what the decoded values of an HDR latent mean, and the HLG signal of the HDR master.

An HDR pipeline's VAE decodes to log codes, not to a picture: decoded ``x`` in [-1, 1] is the code
``(x + 1) / 2``, clamped to [0, 1] (what farm's decoders hand the blend, unclamped), and the pipeline's
transfer turns codes into scene-linear light. The transfers (:data:`TRANSFERS`), named as the job's
decoder spec names them (``"hdr"``), with their constants and clamps taken from the pipelines' code:

* ``acescct``: LTX-2's native ``--hdr`` mode (ltx-pipelines ``utils/media_io/color_config.py``
  ``HDRColorSpace.transfer``, ltx-core ``hdr.py`` ``HDRTransfer.ACESCCT``): ACEScct codes (ACES
  S-2016-001). Decompressed onto their own primaries, AP1: scene-linear **ACEScg**, negatives clamped
  to 0 (``HDRTransfer.to_linear``).
* ``logc3``: the HDR IC-LoRA path (diffusers 0.42 ``LTX2HDRPipeline``, ``pipelines/ltx2/image_processor.py``
  ``LTX2VideoHDRProcessor.postprocess_hdr_video``; ltx-core ``HDRTransfer.LOGC3``): ARRI LogC3 (EI 800)
  curve constants on **Rec.709** primaries (not ARRI Wide Gamut 3: ltx-core's ``native_primaries`` is
  Rec.709), so scene-linear Rec.709 in [-0.0173, 55.1], unclamped below as diffusers leaves it.

Both pipelines decode in float32 for HDR; farm keeps the blended scene-linear frames as float16 (ACEScct's
top code is 222.9, LogC3's 55.1: far inside half-float's range).

The HDR master (`farm.media.hlg`) is BT.2100 HLG in BT.2020, made as LTX-2's own master is (ltx-core
``color/hlg.py``): scene-linear Rec.709 → BT.2020 (by OpenColorIO, `farm.media.colour`), diffuse white 1.0
at HLG signal 0.75 (linearly below it, rolled off exponentially towards 1.0 above it), the HLG OETF
(ARIB STD-B67), then BT.2020 non-constant-luminance Y'CbCr, 10-bit limited range, 4:2:0.

The conversions take numpy arrays or torch tensors (the blend's, on its device) and return the same kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.errors import FarmError

__all__ = [
    "TRANSFERS",
    "HdrTransfer",
    "codes_to_linear",
    "decoded_space",
    "hdr_transfer",
    "hlg_signal",
    "hlg_yuv420p10",
    "scene_linear_half",
]

# ARRI LogC3 (EI 800), as in diffusers' LTX2VideoHDRProcessor and ltx-core's hdr.py.
_LOGC3_A, _LOGC3_B, _LOGC3_C, _LOGC3_D = 5.555556, 0.052272, 0.247190, 0.385537
_LOGC3_E, _LOGC3_F, _LOGC3_CUT = 5.367655, 0.092809, 0.010591
# ACEScct (ACES S-2016-001), as in ltx-core's hdr.py.
_ACESCCT_A, _ACESCCT_B, _ACESCCT_Y_BREAK = 10.5402377416545, 0.0729055341958355, 0.155251141552511
_ACESCCT_M, _ACESCCT_LOG_B = 17.52, 9.72
# HLG OETF (ARIB STD-B67 / BT.2100) and LTX-2's master: diffuse white 1.0 at this HLG signal.
_HLG_A, _HLG_B, _HLG_C = 0.17883277, 0.28466892, 0.55991073
HLG_WHITE_SIGNAL = 0.75
# BT.2020 non-constant luminance: Y' = KR R' + KG G' + KB B'; Cb = (B' - Y') / CB_SCALE, Cr likewise.
_KR, _KB = 0.2627, 0.0593
_KG = 1.0 - _KR - _KB
_CB_SCALE, _CR_SCALE = 2.0 * (1.0 - _KB), 2.0 * (1.0 - _KR)


@dataclass(frozen=True)
class HdrTransfer:
    """One HDR pipeline's transfer: its codes, the scene-linear space they decompress to, its source."""

    name: str  # as the decoder spec's "hdr" names it
    linear_space: str  # the farm.media.colour space of the decompressed values
    code_space: str | None  # the colour space of the codes themselves, where OpenColorIO has it
    clamp_negative: bool  # the pipeline clamps linear values below 0
    source: str


TRANSFERS: dict[str, HdrTransfer] = {
    t.name: t
    for t in (
        HdrTransfer("acescct", "acescg", "acescct", True,
                    "LTX-2 native --hdr (ltx-pipelines HDRColorSpace; ltx-core HDRTransfer.ACESCCT)"),
        HdrTransfer("logc3", "lin_rec709", None, False,
                    "LTX-2 HDR IC-LoRA (diffusers LTX2HDRPipeline; ltx-core HDRTransfer.LOGC3)"),
    )
}  # fmt: skip


def hdr_transfer(name: str, where: str = "hdr") -> HdrTransfer:
    """The transfer called `name`; FarmError listing the valid names otherwise."""
    if name not in TRANSFERS:
        raise FarmError(f"{where}: unknown HDR transfer {name!r}; choose one of {list(TRANSFERS)}")
    return TRANSFERS[name]


def decoded_space(hdr: str | None) -> str:
    """The `farm.media.colour` space of a render's frames: an SDR decode's ``g24_rec709``, or the
    scene-linear space of the decoder spec's HDR transfer (what frames.zarr holds in an HDR render)."""
    return "g24_rec709" if hdr is None else hdr_transfer(hdr).linear_space


def _ops(values: Any) -> tuple[Any, Any]:
    """(clip, where) for numpy arrays or torch tensors."""
    if isinstance(values, np.ndarray):
        return np.clip, np.where
    import torch

    return (lambda x, lo, hi: torch.clamp(x, lo, hi)), torch.where


def _float32(values: Any) -> Any:
    if isinstance(values, np.ndarray):
        return values.astype(np.float32, copy=False)
    if hasattr(values, "float"):  # a torch tensor
        return values.float()
    return np.asarray(values, dtype=np.float32)


def _logc3_to_linear(codes: Any) -> Any:
    clip, where = _ops(codes)
    x = clip(codes, 0.0, 1.0)
    from_log = (10.0 ** ((x - _LOGC3_D) / _LOGC3_C) - _LOGC3_B) / _LOGC3_A
    from_lin = (x - _LOGC3_F) / _LOGC3_E
    return where(x >= _LOGC3_E * _LOGC3_CUT + _LOGC3_F, from_log, from_lin)


def _acescct_to_linear(codes: Any) -> Any:
    clip, where = _ops(codes)
    x = clip(codes, 0.0, 1.0)
    from_log = 2.0 ** (x * _ACESCCT_M - _ACESCCT_LOG_B)
    from_lin = (x - _ACESCCT_B) / _ACESCCT_A
    return where(x > _ACESCCT_Y_BREAK, from_log, from_lin)


_CURVES = {"acescct": _acescct_to_linear, "logc3": _logc3_to_linear}


def codes_to_linear(codes: Any, transfer: str) -> Any:
    """Decoded codes (the decoder's output mapped to [0, 1]: ``(x + 1) / 2``; clamped here) → float32
    scene-linear values in ``TRANSFERS[transfer].linear_space``. numpy or torch in, the same out."""
    spec = hdr_transfer(transfer)
    linear = _CURVES[spec.name](_float32(codes))
    if spec.clamp_negative:
        clip, _ = _ops(linear)
        linear = clip(linear, 0.0, None)
    return linear


def scene_linear_half(codes: Any, transfer: str) -> Any:
    """:func:`codes_to_linear` as float16: what an HDR blend keeps in Zarr instead of uint8 levels."""
    linear = codes_to_linear(codes, transfer)
    if isinstance(linear, np.ndarray):
        return linear.astype(np.float16)
    import torch

    return linear.to(torch.float16)


def _hlg_inverse_oetf(signal: float) -> float:
    if signal <= 0.5:
        return signal * signal / 3.0
    return (math.exp((signal - _HLG_C) / _HLG_A) + _HLG_B) / 12.0


def hlg_signal(linear_rec2020: Any, white_signal: float = HLG_WHITE_SIGNAL) -> np.ndarray:
    """Scene-linear BT.2020 RGB (numpy, any shape) → HLG signal in [0, 1], float32.

    Linear 1.0 (diffuse white) lands on `white_signal`; above it, highlights roll off exponentially
    towards signal 1.0 with a slope continuous at white; negative and NaN values become 0."""
    lin = np.nan_to_num(np.asarray(linear_rec2020, dtype=np.float32), nan=0.0, neginf=0.0)
    lin = np.maximum(lin, 0.0)
    white = _hlg_inverse_oetf(white_signal)
    rolloff = white / (1.0 - white)
    with np.errstate(over="ignore"):
        scene = np.where(lin <= 1.0, lin * white, 1.0 - (1.0 - white) * np.exp(-rolloff * (lin - 1.0)))
    scene = scene.astype(np.float32)
    low = np.sqrt(np.maximum(3.0 * scene, 0.0))
    high = _HLG_A * np.log(np.maximum(12.0 * scene - _HLG_B, 1e-12)) + _HLG_C
    return np.clip(np.where(scene <= 1.0 / 12.0, low, high), 0.0, 1.0).astype(np.float32)


def hlg_yuv420p10(signal: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HLG RGB signal ``[F, H, W, 3]`` in [0, 1] → BT.2020 NCL Y'CbCr, 10-bit limited range, 4:2:0:
    uint16 planes Y ``[F, H, W]``, Cb and Cr ``[F, H/2, W/2]`` (chroma: the mean of each 2×2 block,
    centre-sited, as `farm.media.yuv`). H and W must be even."""
    rgb = np.asarray(signal, dtype=np.float32)
    f, h, w, _ = rgb.shape
    if h % 2 or w % 2:
        raise FarmError(f"hlg_yuv420p10: 4:2:0 needs an even frame size, got {w}x{h} (W x H)")
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = _KR * r + _KG * g + _KB * b

    def block_mean(plane: np.ndarray) -> np.ndarray:
        return plane.reshape(f, h // 2, 2, w // 2, 2).mean(axis=(2, 4), dtype=np.float32)

    cb, cr = block_mean((b - y) / _CB_SCALE), block_mean((r - y) / _CR_SCALE)

    def levels(x: np.ndarray, offset: float, scale: float) -> np.ndarray:
        return np.clip(np.round(offset + scale * x), 0, 1023).astype(np.uint16)

    return levels(y, 64.0, 876.0), levels(cb, 512.0, 896.0), levels(cr, 512.0, 896.0)
