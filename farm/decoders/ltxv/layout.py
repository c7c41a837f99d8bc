"""LTX-Video 0.9.x's single files in Lightricks' layout (`farm.decoders.ltx2.layout`, shared with LTX-2):
which of its namings a config has, and the conversion to diffusers' names by diffusers' own converter."""

from __future__ import annotations

from typing import Any

from farm.decoders.checkpoints import VAE_PREFIX


def ltxv_variant(full_config: dict[str, Any]) -> str:
    """Which of LTX-Video's decoder namings a config has: 0.9.0 ("0.9.0": up blocks with their own
    conv_in) or 0.9.1 and later ("0.9.1": residual upsamplers)."""
    return "0.9.1" if any(full_config.get("upsample_residual") or ()) else "0.9.0"


def convert_ltxv_names(tensors: dict[str, Any], prefix: str, stand_in: Any) -> dict[str, Any]:
    """diffusers' LTX-Video converter on name-and-shape stand-ins (`tensors`, named as in the file, under
    `prefix`). The converter keeps names with "vae." and tells 0.9.5 from the encoder's last convolution;
    the decoder's names are the same for 0.9.1 and 0.9.5, and a file without an encoder has no say
    (`stand_in` stands for that convolution)."""
    from diffusers.loaders import single_file_utils as su

    inner = {VAE_PREFIX + n[len(prefix) :]: v for n, v in tensors.items()}
    inner.setdefault("vae.encoder.conv_out.conv.weight", stand_in)
    return dict(su.convert_ltx_vae_checkpoint_to_diffusers(inner))
