"""Excerpts, verbatim, of the functions LTX-2's pipelines run on an HDR decode (see README.md here):

* ltx-core ``color/hlg.py``: the HLG constants, ``hlg_inverse_oetf`` and ``HlgGpuConverter`` (scene-linear
  frames → the master's BT.2020 HLG 10-bit Y'CbCr planes, before libx265);
* ltx-pipelines ``utils/media_io/color_config.py``: ``decode_hdr_video`` (a decoded chunk in [0, 1] →
  scene-linear HDR, what the EXR and HLG sinks of ``encode_video`` take);
* ltx-pipelines ``utils/media_io/range_map.py``: ``to_vae_range`` and ``from_vae_range``.

Only the import lines differ from the source files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .hdr import HDRTransfer
from .primaries import Primaries
from .yuv import ColorRange, ColorSpace, rgb_to_yuv420p10

# --- ltx-core src/ltx_core/color/hlg.py -------------------------------------------------------
# FFmpeg AVColor* tags not covered by ColorSpace / ColorRange.
_AV_COLOR_PRIMARIES_BT2020 = 9
_AV_COLOR_TRC_ARIB_STD_B67 = 18  # HLG

# ARIB STD-B67 (HLG) OETF constants.
HLG_A, HLG_B, HLG_C = 0.17883277, 0.28466892, 0.55991073


def hlg_inverse_oetf(v: float) -> float:
    """Inverse HLG OETF for a scalar signal value → scene-linear."""
    return (v * v) / 3.0 if v <= 0.5 else (math.exp((v - HLG_C) / HLG_A) + HLG_B) / 12.0


@dataclass
class HlgGpuConverter:
    """GPU linear-HDR ``[F,H,W,3]`` → planar uint16 YUV420P10 (BT.2020 / HLG / limited)."""

    prim_mat: torch.Tensor  # [3, 3] on device
    white_x: float
    roll_k: float

    @classmethod
    def create(
        cls,
        primaries: Primaries = Primaries.REC709,
        white_signal: float = 0.75,
        rolloff_k: float | None = None,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> HlgGpuConverter:
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        white_x = hlg_inverse_oetf(white_signal)
        roll_k = rolloff_k if rolloff_k is not None else white_x / (1.0 - white_x)
        prim = primaries.matrix_to_rec2020.to(device=device, dtype=dtype)
        return cls(prim_mat=prim, white_x=float(white_x), roll_k=float(roll_k))

    def to_hlg_signal_(self, rgb_linear_chw: torch.Tensor) -> torch.Tensor:
        """``(*, 3, H, W)`` scene-linear → HLG signal ``[0, 1]``."""
        lin = torch.nan_to_num(
            (rgb_linear_chw.movedim(-3, -1) @ self.prim_mat.T).clamp(min=0.0),
            nan=0.0,
            neginf=0.0,
        )
        x = torch.where(
            lin <= 1.0,
            lin * self.white_x,
            1.0 - (1.0 - self.white_x) * torch.exp(-self.roll_k * (lin - 1.0)),
        )
        sig = torch.where(
            x <= 1.0 / 12.0,
            torch.sqrt((3.0 * x).clamp(min=0.0)),
            HLG_A * torch.log((12.0 * x - HLG_B).clamp(min=1e-12)) + HLG_C,
        )
        return sig.clamp(0.0, 1.0).movedim(-1, -3)

    def __call__(self, frames_fhwc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[F,H,W,3]`` scene-linear → planar uint16 Y, U, V on the same device."""
        if frames_fhwc.ndim != 4 or frames_fhwc.shape[-1] != 3:
            raise ValueError(f"expected [F,H,W,3], got {tuple(frames_fhwc.shape)}")
        x = frames_fhwc.to(device=self.prim_mat.device, dtype=self.prim_mat.dtype)
        hlg = self.to_hlg_signal_(x.movedim(-1, -3).contiguous())
        return rgb_to_yuv420p10(hlg, ColorSpace.BT_2020_NCL, ColorRange.MPEG)


# --- ltx-pipelines src/ltx_pipelines/utils/media_io/color_config.py ------------------------------

def decode_hdr_video(
    decoded_video: torch.Tensor,
    transfer: HDRTransfer,
    out_primaries: Primaries = Primaries.REC709,
) -> torch.Tensor:
    """VAE decode ``[F,H,W,C]`` in ``[0,1]`` → scene-linear HDR float32."""
    video = decoded_video.float().permute(3, 0, 1, 2).unsqueeze(0)
    hdr = transfer.to_linear(video, out_primaries=out_primaries)
    return hdr[0].permute(1, 2, 3, 0).contiguous()

# --- ltx-pipelines src/ltx_pipelines/utils/media_io/range_map.py ---------------------------------

def to_vae_range(x: torch.Tensor) -> torch.Tensor:
    """Map [0, 1] working-space codes to [-1, 1] (VAE input convention).
    Raises:
        ValueError: If ``x`` is outside ``[0, 1]`` (callers must compress or
            already hold valid working-space codes — this does not clamp).
    """
    if bool((x < 0).any() or (x > 1).any()):
        raise ValueError(f"to_vae_range expects values in [0, 1]; got min={float(x.min())}, max={float(x.max())}")
    return x * 2.0 - 1.0


def from_vae_range(z: torch.Tensor) -> torch.Tensor:
    """Map [-1, 1] (VAE output convention) to [0, 1]."""
    return torch.clamp((z + 1.0) / 2.0, 0.0, 1.0)
