"""CogVideoX's named VAE configs (diffusers' `AutoencoderKLCogVideoX` arguments).

diffusers' ``scripts/convert_cogvideox_to_diffusers.py`` (``convert_vae``) builds every release from the
class's defaults and changes only the latent scaling: CogVideoX-2b keeps 1.15258426 (the default),
CogVideoX-5b (and its image-to-video model) takes 0.7, and CogVideoX1.5 (``--version 1.5``) takes 0.7 with
``invert_scale_latents`` (which only its image-to-video pipeline reads, when it encodes the image). The
decoder is the same network in all three.
"""

from __future__ import annotations

COGVIDEOX_5B = {"scaling_factor": 0.7}
COGVIDEOX_15 = {"scaling_factor": 0.7, "invert_scale_latents": True}
# The released structure (four up blocks, two of them doubling time, spatial norms conditioned on the
# latent, causal convolutions) at 8 base channels; GroupNorm needs channels divisible by its groups.
COGVIDEOX_TINY = {
    "block_out_channels": [8, 16, 16, 32],
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "scaling_factor": 0.7,
}
