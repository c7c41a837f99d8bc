"""Mochi's original VAE layout (``mochi-original``): genmo's decoder as its own code names it, which
ComfyUI's repackaged ``mochi_vae.safetensors`` holds under ``decoder.`` (beside ``encoder.``). The
original name of each of diffusers' decoder tensors follows ``convert_mochi_vae_state_dict_to_diffusers``
in diffusers' ``scripts/convert_mochi_to_diffusers.py`` (diffusers' library has no converter for it):
``blocks.0`` is ``conv_in`` then ``block_in``'s resnets, ``blocks.1..n-1`` the up blocks (``.blocks.i``
and ``.proj``), ``blocks.n`` ``block_out``'s resnets, ``output_proj`` the last projection; a resnet's
``stack`` is norm (0), activation, convolution (2), norm (3), activation, convolution (5). Names only."""

from __future__ import annotations

import re
from typing import Any

MOCHI_ORIGINAL = "mochi-original"

_RESNET_PARTS = {"norm1.norm_layer.": "stack.0.", "conv1.conv.": "stack.2.", "norm2.norm_layer.": "stack.3.",
                 "conv2.conv.": "stack.5."}  # fmt: skip
_BLOCK_IN = re.compile(r"decoder\.block_in\.resnets\.(\d+)\.(.*)")
_UP = re.compile(r"decoder\.up_blocks\.(\d+)\.(?:resnets\.(\d+)\.(.*)|(proj\..*))")
_BLOCK_OUT = re.compile(r"decoder\.block_out\.resnets\.(\d+)\.(.*)")


def is_mochi_original(names: list[str]) -> bool:
    """Whether a checkpoint's VAE names (a file's prefix removed) are in genmo's layout."""
    return any(n.startswith("decoder.blocks.") for n in names) and not any(
        n.startswith("decoder.block_in.") for n in names
    )


def _resnet_part(rest: str) -> str:
    for new, old in _RESNET_PARTS.items():
        if rest.startswith(new):
            return old + rest[len(new) :]
    return rest


def mochi_original_name(name: str, full_config: dict[str, Any]) -> str:
    """The name diffusers' decoder tensor `name` has in genmo's layout."""
    if name.startswith("decoder.conv_in."):
        return "decoder.blocks.0.0." + name[len("decoder.conv_in.") :]
    if name.startswith("decoder.proj_out."):
        return "decoder.output_proj." + name[len("decoder.proj_out.") :]
    if m := _BLOCK_IN.fullmatch(name):
        return f"decoder.blocks.0.{int(m.group(1)) + 1}.{_resnet_part(m.group(2))}"
    if m := _UP.fullmatch(name):
        block = int(m.group(1)) + 1
        if m.group(4) is not None:
            return f"decoder.blocks.{block}.{m.group(4)}"
        return f"decoder.blocks.{block}.blocks.{m.group(2)}.{_resnet_part(m.group(3))}"
    if m := _BLOCK_OUT.fullmatch(name):
        last = len(full_config["decoder_block_out_channels"])
        return f"decoder.blocks.{last}.{m.group(1)}.{_resnet_part(m.group(2))}"
    return name
