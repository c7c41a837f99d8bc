"""An LTX single file's audio VAE, as its ``config`` metadata says (``config`` → ``audio_vae``, the form
Lightricks' ltx-core reads), against a farm audio spec's audio VAE config (diffusers'
`AutoencoderKLLTX2Audio` arguments). Pure: no torch, no diffusers; the driver refuses a contradiction before
any cluster starts.

ltx-core's reading (`ltx_core/model/audio_vae/model_configurator.py`, `AudioDecoderConfigurator`, 1.0.0):
the decoder's shape from ``audio_vae.model.params.ddconfig``, the rate from ``model.params.sampling_rate``,
the mel hop and causality from ``preprocessing.stft``, the mel bins from ``ddconfig.mel_bins``, else
``preprocessing.mel.n_mel_channels``, else ``variables.mel_bins``. Keys a file leaves out take ltx-core's
defaults, which differ from diffusers' in two places: a mid-block attention is on, and attention is asked
at resolutions 8, 16 and 32 (none of the released decoder's levels, 64 to 256, so it builds none).
"""

from __future__ import annotations

from typing import Any

# diffusers 0.42.1's constructor defaults (tests/test_conformance_ltx2_sound.py checks them against the
# installed class), which complete a spec's audio VAE config as the worker builds it.
LTX2_AUDIO_VAE_DEFAULTS: dict[str, Any] = {
    "base_channels": 128, "output_channels": 2, "ch_mult": (1, 2, 4), "num_res_blocks": 2,
    "attn_resolutions": None, "in_channels": 2, "resolution": 256, "latent_channels": 8, "norm_type": "pixel",
    "causality_axis": "height", "dropout": 0.0, "mid_block_add_attention": False, "sample_rate": 16000,
    "mel_hop_length": 160, "is_causal": True, "mel_bins": 64, "double_z": True,
}  # fmt: skip

# ltx-core's ddconfig keys → diffusers' arguments, with ltx-core's default for a key a file leaves out.
_DDCONFIG = {
    "ch": ("base_channels", 128),
    "out_ch": ("output_channels", 2),
    "ch_mult": ("ch_mult", [1, 2, 4]),
    "num_res_blocks": ("num_res_blocks", 2),
    "resolution": ("resolution", 256),
    "z_channels": ("latent_channels", 8),
    "norm_type": ("norm_type", "pixel"),
    "causality_axis": ("causality_axis", "height"),
    "mid_block_add_attention": ("mid_block_add_attention", True),
}
_LTX_CORE_ATTENTION = [8, 16, 32]


def _attention_levels(resolutions: Any, resolution: int, levels: int) -> list[int]:
    """The decoder levels' resolutions that get attention (what changes the model, not the list given)."""
    asked = set(resolutions or ())
    return sorted(r for r in (resolution // 2**i for i in range(levels)) if r in asked)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def metadata_audio_vae(file_config: dict[str, Any]) -> dict[str, tuple[str, Any]] | None:
    """From a file's ``config`` metadata: the diffusers arguments its audio VAE implies, each with its
    metadata field; None when the metadata has no audio VAE."""
    cfg = file_config.get("audio_vae")
    if not isinstance(cfg, dict):
        return None
    params = _as_dict(_as_dict(cfg.get("model")).get("params"))
    ddconfig = _as_dict(params.get("ddconfig"))
    preprocessing = _as_dict(cfg.get("preprocessing"))
    stft = _as_dict(preprocessing.get("stft"))
    where = "config.audio_vae.model.params.ddconfig"
    out = {arg: (f"{where}.{key}", ddconfig.get(key, default)) for key, (arg, default) in _DDCONFIG.items()}
    out["sample_rate"] = ("config.audio_vae.model.params.sampling_rate", params.get("sampling_rate", 16000))
    out["mel_hop_length"] = ("config.audio_vae.preprocessing.stft.hop_length", stft.get("hop_length", 160))
    out["is_causal"] = ("config.audio_vae.preprocessing.stft.causal", stft.get("causal", True))
    mel = _as_dict(preprocessing.get("mel")).get("n_mel_channels")
    variables = _as_dict(cfg.get("variables")).get("mel_bins")
    for field, value in ((f"{where}.mel_bins", ddconfig.get("mel_bins")),
                         ("config.audio_vae.preprocessing.mel.n_mel_channels", mel),
                         ("config.audio_vae.variables.mel_bins", variables)):  # fmt: skip
        if value:  # ltx-core takes the first one given
            out["mel_bins"] = (field, value)
            break
    levels = len(out["ch_mult"][1])
    attention = ddconfig.get("attn_resolutions", _LTX_CORE_ATTENTION)
    out["attn_resolutions"] = (f"{where}.attn_resolutions",
                               _attention_levels(attention, out["resolution"][1], levels))  # fmt: skip
    return out


def audio_vae_contradictions(file_config: dict[str, Any], vae_config: dict[str, Any]) -> list[str]:
    """Where a spec's audio VAE config differs from what the file's metadata says its audio VAE is: one line
    per argument naming the metadata field, empty when they agree."""
    implied = metadata_audio_vae(file_config)
    if implied is None:
        return []
    full = {**LTX2_AUDIO_VAE_DEFAULTS, **vae_config}
    levels = len(full["ch_mult"])
    full["attn_resolutions"] = _attention_levels(full["attn_resolutions"], full["resolution"], levels)

    def norm(value: Any) -> Any:
        return [norm(v) for v in value] if isinstance(value, list | tuple) else value

    return [
        f"{field} in the file means {arg}={value!r}, the audio config has "
        + (f"attention at levels {full[arg]!r}" if arg == "attn_resolutions" else f"{full[arg]!r}")
        for arg, (field, value) in implied.items()
        if norm(full[arg]) != norm(value)
    ]
