"""RGB → YUV 4:2:0 (BT.709, tv range) on the device that blended the frames.

x264 and x265 take yuv420p. Converting there, from the blend's float pixels, spares the I/O worker
FFmpeg's swscale pass per frame (single-threaded, on the encoder's feeding thread); the planes travel
beside the RGB frames that Zarr needs, 1.5 bytes per pixel more. Chroma is the mean of each 2×2 block
(centre-sited).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# BT.709 luma weights; Cb = (B - Y) / 1.8556, Cr = (R - Y) / 1.5748 (ITU-R BT.709-6, 3.2-3.3).
KR, KG, KB = 0.2126, 0.7152, 0.0722
CB_SCALE, CR_SCALE = 1.8556, 1.5748


def rgb_to_yuv420(pixels: torch.Tensor) -> torch.Tensor:
    """float RGB ``[3, F, H, W]`` in [0, 1] (torch, any device) → uint8 planes ``[F, H * 3 // 2, W]``.

    Each frame's rows hold the Y plane (H rows), then U and V (H / 4 rows each, every row two chroma
    rows of W / 2): the memory layout of FFmpeg's yuv420p. H and W must be even.
    """
    import torch

    _, f, h, w = pixels.shape
    if h % 2 or w % 2:
        raise ValueError(f"yuv420 needs an even frame size, got {w}x{h}")
    rgb = pixels.float().clamp(0.0, 1.0)
    r, g, b = rgb[0], rgb[1], rgb[2]
    y = KR * r + KG * g + KB * b
    cb = torch.nn.functional.avg_pool2d((b - y) / CB_SCALE, 2)
    cr = torch.nn.functional.avg_pool2d((r - y) / CR_SCALE, 2)

    def levels(x: torch.Tensor, offset: float, scale: float) -> torch.Tensor:
        return torch.round(offset + scale * x).clamp(0, 255).to(torch.uint8)

    planes = torch.empty((f, h * 3 // 2, w), dtype=torch.uint8, device=pixels.device)
    planes[:, :h] = levels(y, 16.0, 219.0)
    planes[:, h : h + h // 4] = levels(cb, 128.0, 224.0).reshape(f, h // 4, w)
    planes[:, h + h // 4 :] = levels(cr, 128.0, 224.0).reshape(f, h // 4, w)
    return planes
