"""LTX-2.5's diffusion decoder in Lightricks' layout, as ltx-core 1.2.0 reads it
(`ltx_core/model/video_vae/model_configurator.py`, `_build_diffusion_vae_decoder_sd_ops`): the names of its
`DiffusionVideoDecoder` modules, with, in the released files, one fused ``attn.qkv`` projection (split into
``to_q``/``to_k``/``to_v``), static gates beside three projections (``gate_msa``, ``gate_mlp``,
``gate_ctx``: folded into the projection's rows), the timestep MLP under the reference's
``t_embedder.mlp.{0,2}`` and preview heads (``coarse_*``) that the decoder does not run. Headers only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from farm.decoders.checkpoints import SAFETENSORS_SUFFIX, Derived, TensorInfo, safetensors_header
from farm.decoders.ltx2.layout import LTX_STATISTICS

_LTX_DIFFUSION_RENAMES = (
    (".attn.to_q.", ".attn.qkv.to_q."),
    (".attn.to_k.", ".attn.qkv.to_k."),
    (".attn.to_v.", ".attn.qkv.to_v."),
    (".attn.to_out.0.", ".attn.proj."),
    (".attn.norm_q.", ".attn.q_norm."),
    (".attn.norm_k.", ".attn.k_norm."),
)
_LTX_DIFFUSION_TIMESTEP = (
    ("decoder.t_embedder.mlp.0.", "decoder.t_embedder.timestep_embedder.linear_1."),
    ("decoder.t_embedder.mlp.2.", "decoder.t_embedder.timestep_embedder.linear_2."),
)
# Lightricks' layout: a projection (its weight and bias) and the gate tensor that scales its output rows
LTX_DIFFUSION_GATES = {
    ".attn.proj.": ".gate_msa",
    ".mlp.w_down.": ".gate_mlp",
    ".context_proj.": ".gate_ctx",
}
# names only Lightricks' layout has (diffusers' modules share the rest: det_stages, diff_blocks, ...)
LTX_DIFFUSION_MARKS = (".attn.qkv.", ".attn.proj.", "per_channel_statistics.", "t_embedder.mlp.")


def ltx_diffusion_original_name(name: str) -> str:
    if name in LTX_STATISTICS:
        return LTX_STATISTICS[name]
    for diffusers_part, original in _LTX_DIFFUSION_RENAMES:
        name = name.replace(diffusers_part, original)
    return name


def ltx_diffusion_tensors(
    infos: dict[str, TensorInfo], prefix: str
) -> tuple[dict[str, TensorInfo], dict[str, Derived]]:
    """A Lightricks-layout diffusion decoder file's tensors as the decoder's modules take them: fused
    projections split (virtual names ``…attn.qkv.to_q.weight``), the timestep MLP renamed, gates and
    preview heads consumed; and how each virtual or gated tensor is read (:class:`Derived`)."""
    gate_suffixes = tuple(LTX_DIFFUSION_GATES.values())
    gates = {n for n in infos if n.startswith(prefix + "decoder.") and n.endswith(gate_suffixes)}
    out: dict[str, TensorInfo] = {}
    derived: dict[str, Derived] = {}
    for name, info in infos.items():
        if name in gates or name.startswith(prefix + "decoder.coarse_"):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")) and info.shape and info.shape[0] % 3 == 0:
            for part, which in enumerate("qkv"):
                virtual = f"{name[: -len(leaf)]}to_{which}.{leaf}"
                out[virtual] = TensorInfo((info.shape[0] // 3, *info.shape[1:]), info.dtype, info.file)
                derived[virtual] = Derived(name, part)
            continue
        renamed = name
        for reference, module in _LTX_DIFFUSION_TIMESTEP:
            if name.startswith(prefix + reference):
                renamed = prefix + module + name[len(prefix + reference) :]
                derived[renamed] = Derived(name)
        out[renamed] = info
    for name in out:
        for projection, suffix in LTX_DIFFUSION_GATES.items():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith(projection + leaf) and leaf in ("weight", "bias"):
                gate = name[: -len(projection + leaf)] + suffix
                if gate in gates:
                    base = derived[name].base if name in derived else name
                    derived[name] = Derived(base, derived[name].part if name in derived else None, gate)
    return out, derived


def ltx_diffusion_metadata_mismatches(files: list[Path], full_config: dict[str, Any]) -> list[str]:
    """How the ``config`` JSON a Lightricks file carries in its metadata (``vae`` → ``decoder``, as
    ltx-core's `_build_diffusion_video_decoder` reads it) differs from the decoder config; empty where
    the files carry none."""
    found: list[str] = []
    for f in files:
        if not f.name.endswith(SAFETENSORS_SUFFIX):
            continue
        meta = safetensors_header(f)[0].get("__metadata__") or {}
        try:
            vae = json.loads(meta["config"])["vae"]
        except (KeyError, TypeError, ValueError):
            continue
        if not isinstance(vae, dict):
            continue
        decoder = vae.get("decoder", vae) if isinstance(vae.get("decoder", vae), dict) else vae
        pairs = {"stage_channels": "decoder_stage_channels", "stage_depths": "decoder_stage_depths",
                 "stage5_kernel": "decoder_stage5_kernel", "head_dim": "decoder_head_dim",
                 "patch_size": "patch_size", "t_emb_dim": "decoder_t_emb_dim",
                 "timestep_scale_multiplier": "decoder_timestep_scale_multiplier",
                 "default_num_inference_steps": "decoder_num_inference_steps"}  # fmt: skip
        theirs = {key: decoder[key] for key in pairs if key in decoder}
        if "stage_kernels" in decoder:  # one a stage; the last is stage 5's, read from stage5_kernel
            theirs["stage_kernels"] = decoder["stage_kernels"][: len(full_config["decoder_stage_kernels"])]
            pairs["stage_kernels"] = "decoder_stage_kernels"
        if "model_output_type" in vae:
            theirs["model_output_type"] = vae["model_output_type"]
            pairs["model_output_type"] = "decoder_model_output_type"
        for key, value in theirs.items():
            ours = full_config.get(pairs[key])
            if json.loads(json.dumps(value)) != json.loads(json.dumps(ours)):
                found.append(f"{key} {value!r} in {f.name}'s config ≠ {pairs[key]} {ours!r}")
    return found




def is_lightricks_diffusion(names: list[str]) -> bool:
    """Whether a diffusion decoder checkpoint's names are Lightricks' (ltx-core's) rather than diffusers'."""
    return any(mark in n for n in names for mark in LTX_DIFFUSION_MARKS)

