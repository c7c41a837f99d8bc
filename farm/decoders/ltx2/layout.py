"""Lightricks' original checkpoint layout (LTX-2's full checkpoints under ``vae.``, ComfyUI's VAE-only
files, and LTX-Video 0.9.x's single files, which share the naming): detection, the original names of
diffusers' tensors (the inverse of diffusers' converters for the decoder's tensors), and the conversion
to diffusers' names by diffusers' own converter. Names only: no torch; diffusers imported inside
:func:`convert_ltx2_names` alone."""

from __future__ import annotations

from typing import Any

LTX_ORIGINAL = "ltx-original"

LTX_STATISTICS = {
    "latents_mean": "per_channel_statistics.mean-of-means",
    "latents_std": "per_channel_statistics.std-of-means",
}


def is_ltx_original(names: list[str]) -> bool:
    """Whether a checkpoint's VAE names (a file's prefix removed) are Lightricks' (no diffusers mid block)."""
    if any(n.startswith("decoder.mid_block.") for n in names):
        return False
    return any(n.startswith("decoder.up_blocks.0.res_blocks.") or "per_channel_statistics." in n
               for n in names)  # fmt: skip


def ltx_block_table(variant: str, n_blocks: int) -> list[tuple[str, str]]:
    """(diffusers prefix, original prefix) of the decoder's blocks, longest diffusers prefix first."""
    if variant == "0.9.0":  # diffusers' VAE_KEYS_RENAME_DICT, inverted
        forward = ["mid_block", "up_blocks.0", "up_blocks.1.upsamplers.0", "up_blocks.1",
                   "up_blocks.2.conv_in", "up_blocks.2.upsamplers.0", "up_blocks.2", "up_blocks.3.conv_in",
                   "up_blocks.3.upsamplers.0", "up_blocks.3"]  # fmt: skip
    else:  # LTX-2 and LTX-Video 0.9.1/0.9.5: each up block's upsampler, then its resnets
        forward = ["mid_block"] + [
            p for i in range(n_blocks) for p in (f"up_blocks.{i}.upsamplers.0", f"up_blocks.{i}")
        ]
    table = [(f"decoder.{d}.", f"decoder.up_blocks.{i}.") for i, d in enumerate(forward)]
    return sorted(table, key=lambda t: -len(t[0]))


def ltx_original_name(name: str, variant: str, full: dict[str, Any]) -> str:
    """The name diffusers' tensor `name` has in Lightricks' layout, for LTX-2 (`variant` "ltx2") or
    LTX-Video ("0.9.0", or "0.9.1" for 0.9.1 and later: `farm.decoders.ltxv.layout.ltxv_variant`)."""
    if name in LTX_STATISTICS:
        return LTX_STATISTICS[name]
    for diffusers_prefix, original in ltx_block_table(variant, len(full["decoder_block_out_channels"])):
        if name.startswith(diffusers_prefix):
            name = original + name[len(diffusers_prefix) :]
            break
    name = name.replace(".resnets.", ".res_blocks.")
    if variant != "ltx2":  # LTX-Video's converter also renames these
        name = name.replace("conv_shortcut.conv.", "conv_shortcut.").replace(".norm3.", ".norm3.norm.")
        for top in ("time_embedder.", "scale_shift_table"):
            if name.startswith("decoder." + top):
                name = "decoder.last_" + name[len("decoder.") :]
    return name


# LTX-2.3's fourth decoder stage, which diffusers' single-file converter (LTX-2 2.0's names) leaves as it
# found it: the conversion script's LTX_2_3_VIDEO_VAE_RENAME_DICT (`scripts/convert_ltx2_to_diffusers.py`).
_LTX2_3_UP_BLOCKS = {"decoder.up_blocks.7.": "decoder.up_blocks.3.upsamplers.0.",
                     "decoder.up_blocks.8.": "decoder.up_blocks.3."}  # fmt: skip


def _ltx2_3_up_blocks(name: str) -> str:
    for old, new in _LTX2_3_UP_BLOCKS.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def convert_ltx2_names(tensors: dict[str, Any]) -> dict[str, Any]:
    """diffusers' LTX-2 converter on name-and-shape stand-ins (the video VAE's names only: never
    ``audio_vae.*``), with LTX-2.3's fourth stage renamed as the conversion script does."""
    from diffusers.loaders import single_file_utils as su

    out = su.convert_ltx2_vae_to_diffusers(tensors)
    return {_ltx2_3_up_blocks(k): v for k, v in out.items()}
