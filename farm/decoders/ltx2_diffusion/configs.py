"""LTX-2.5's named diffusion decoder configs (diffusers' `LTX2VideoDiffusionDecoderModel` arguments)."""

from __future__ import annotations

# Same class, a few channels and 3x3x3 windows: decodes 9x64x96 in well under a second on one CPU core.
LTX2_DIFFUSION_TINY = {
    "latent_channels": 8,
    "decoder_head_dim": 8,
    "decoder_stage_channels": [32, 16, 8, 8, 8],
    "decoder_stage_depths": [1, 1, 1, 1, 1],
    "decoder_stage_kernels": [[3, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]],
    "decoder_upsample_channel_reductions": [2, 2, 1, 1],
    "decoder_stage5_kernel": [3, 3, 3],
    "decoder_t_emb_dim": 16,
}
