"""MiniMax-H3's sound: audio latents ``[2, C, T]`` → stereo waveform, by diffusers'
`AutoencoderKLMiniMaxH3Audio` (a BigVGAN decoder straight to a 32 kHz waveform: no mel, no vocoder),
decoded whole per shot on a worker.

The audio VAE is mono: the pipeline carries the two stereo channels as two batch items. A shot's audio
latent is what the pipeline's after-denoise step leaves (``audio_latents``, ``[2, C, T]``: stereo channel,
latent channel, latent frame), still normalized; farm decodes it as ``MiniMaxH3AudioDecodeStep`` does:
``z * latents_std + latents_mean`` per latent channel (the VAE config's statistics), ``audio_vae.decode``
(``[2, 1, T * hop]``, clamped to [-1, 1]), the batch axis becoming the channels.

Spec config: the VAE's constructor arguments (``minimax-h3-audio``: the class's defaults, which describe
the released VAE; ``minimax-h3-audio-tiny``). Weights: the VAE's diffusers folder (``audio_vae/`` of a
pipeline folder, or the pipeline folder holding it), whose config.json carries the latent statistics and
must agree with the spec's config, or one .safetensors file of its tensors (names as the class's, bare or
under ``audio_vae.``) with the statistics in the spec's config. RANDOM weights without statistics decode
the latents as given (mean 0, std 1). The VAE runs in float32 whatever the pipeline's dtype: diffusers keeps
it so (``_keep_in_fp32_modules``).

Timing (pure, from the config): ``prod(decoder_rates)`` samples per latent frame (800) at
``sampling_rate`` (32 kHz): 40 latent frames a second. The pipeline makes ``round(frames / 24 * 40)``
latent frames for a video of `frames` frames at its 24 fps (``audio_latent_num_frames``).
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from farm.decoders.sound_base import SoundSpec, parse_weights
from farm.errors import FarmError

FAMILY = "minimax-h3-audio"
STEREO = 2  # MINIMAX_H3_AUDIO_CHANNELS: the pipeline's two stereo channels, as two batch items

# The class's defaults (diffusers 0.42.1), which its docstring gives as the released VAE's; diffusers ships
# no conversion script for it (its checkpoint names are the class's own). The released folder's config.json
# adds the latent statistics (32 values each).
DEFAULTS: dict[str, Any] = {
    "encoder_dim": 64, "encoder_rates": [2, 4, 4, 5, 5], "latent_dim": 2048, "latent_channels": 32,
    "num_attention_heads": 8, "decoder_dim": 1024, "decoder_rates": [5, 5, 2, 2, 2, 2, 2],
    "decoder_kernel_sizes": [9, 9, 4, 4, 4, 4, 4], "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "sampling_rate": 32000,
    "latents_mean": None, "latents_std": None,
}  # fmt: skip
MINIMAX_H3_AUDIO: dict[str, Any] = {}
# The same classes and rates (800 samples per latent frame at 32 kHz, so the released timing) at a few
# channels: three BigVGAN stages (8 x 10 x 10) of 16, 8 and 4 channels, one AMP block each; latent
# statistics away from 0 / 1 so that un-normalising shows.
MINIMAX_H3_AUDIO_TINY: dict[str, Any] = {
    "encoder_dim": 4, "latent_dim": 16, "latent_channels": 4, "num_attention_heads": 2, "decoder_dim": 32,
    "decoder_rates": [8, 10, 10], "decoder_kernel_sizes": [16, 20, 20], "resblock_kernel_sizes": [3],
    "resblock_dilation_sizes": [[1, 3, 5]], "latents_mean": [0.3, -0.2, 0.1, -0.4],
    "latents_std": [0.7, 1.3, 0.9, 1.6],
}  # fmt: skip
NAMED_CONFIGS = {"minimax-h3-audio": MINIMAX_H3_AUDIO, "minimax-h3-audio-tiny": MINIMAX_H3_AUDIO_TINY}
STATISTICS = ("latents_mean", "latents_std")
# Tensors a decode needs (the encoder and the posterior heads are not used)
DECODE_PREFIXES = ("decoder.", "dec_in_proj.")
CHECKPOINT_PREFIX = "audio_vae."


@dataclass(frozen=True)
class MiniMaxH3AudioSpec(SoundSpec):
    family: ClassVar[str] = FAMILY
    named_configs: ClassVar[dict[str, Any]] = NAMED_CONFIGS
    latent_dims: ClassVar[tuple[str, ...]] = ("stereo_channel", "audio_channel", "audio_frame")
    latent_layout: ClassVar[str] = "[2, C, T]"
    audio_vae_class: ClassVar[str] = "AutoencoderKLMiniMaxH3Audio"

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> MiniMaxH3AudioSpec:
        config = raw.get("config", FAMILY)
        if isinstance(config, str):
            if config not in NAMED_CONFIGS:
                raise FarmError(f"{where}: unknown audio config {config!r}; named configs: "
                                f"{sorted(NAMED_CONFIGS)} (or {{...}}, AutoencoderKLMiniMaxH3Audio's "
                                "constructor arguments)")  # fmt: skip
            name, resolved = config, json.loads(json.dumps(NAMED_CONFIGS[config]))
        elif isinstance(config, dict):
            unknown = sorted(set(config) - set(DEFAULTS))
            if unknown:
                raise FarmError(f"{where}: config has arguments AutoencoderKLMiniMaxH3Audio does not take: "
                                f"{unknown}; it takes {sorted(DEFAULTS)}")  # fmt: skip
            name, resolved = None, dict(config)
        else:
            raise FarmError(f"{where}: 'config' must be a config name or {{...}} "
                            "(AutoencoderKLMiniMaxH3Audio's constructor arguments), "
                            f"got {config!r}")  # fmt: skip
        weights = parse_weights(raw, where, "/local/audio_vae/folder/or/file.safetensors",
                                "the audio VAE's diffusers folder (or the pipeline folder holding "
                                "audio_vae/) or a .safetensors file")  # fmt: skip
        dtype = raw.get("dtype", "float32")
        if dtype != "float32":
            raise FarmError(f"{where}: dtype {dtype!r} is not supported; MiniMax-H3's audio VAE decodes "
                            "in float32 (diffusers keeps it so whatever the pipeline's dtype): use "
                            "'float32'")  # fmt: skip
        if raw.get("config_revision") is not None:
            raise FarmError(f"{where}: 'config_revision': farm has not revised {FAMILY}'s configs; remove it")
        spec = cls(name, resolved, dict(weights), dtype)
        spec.check_config(where)
        return spec

    @property
    def full_config(self) -> dict[str, Any]:
        return {**DEFAULTS, **self.config}

    def check_config(self, where: str) -> None:
        full = self.full_config
        hop, up = math.prod(full["encoder_rates"]), math.prod(full["decoder_rates"])
        if hop != up:
            raise FarmError(f"{where}: decoder_rates upsample by {up} but encoder_rates hop {hop}; they "
                            "must be equal (AutoencoderKLMiniMaxH3Audio)")  # fmt: skip
        c = int(full["latent_channels"])
        if (full["latents_mean"] is None) != (full["latents_std"] is None):
            raise FarmError(f"{where}: give both latents_mean and latents_std, or neither")
        for key in STATISTICS:
            value = full[key]
            if value is not None and (not isinstance(value, list) or len(value) != c):
                raise FarmError(f"{where}: {key} must be {c} numbers (one per latent channel), got {value!r}")

    # ---- timing (pure) ------------------------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return int(self.full_config["sampling_rate"])

    @property
    def hop(self) -> int:
        """Waveform samples per audio latent frame."""
        return math.prod(int(r) for r in self.full_config["decoder_rates"])

    @property
    def latents_per_second(self) -> float:
        return self.sample_rate / self.hop

    @property
    def channels(self) -> int:
        return STEREO

    @property
    def latent_channels(self) -> int:
        return int(self.full_config["latent_channels"])

    def decoded_samples(self, latent_frames: int) -> int:
        return latent_frames * self.hop

    def latent_shape(self, latent_frames: int) -> tuple[int, ...]:
        return STEREO, self.latent_channels, latent_frames

    def check_latent(self, shape: tuple[int, ...], where: str) -> None:
        if len(shape) != 3 or shape[0] != STEREO or shape[1] != self.latent_channels or shape[2] < 1:
            raise FarmError(
                f"{where}: audio latent has shape {list(shape)}; {self.describe()} takes [2, C, T] with "
                f"C = {self.latent_channels} (the pipeline's audio_latents after its after-denoise step: "
                "the two stereo channels, then the latent channels and frames)"
            )

    # ---- weights (cheap checks) ----------------------------------------------------------------------

    def check_weights(self) -> None:
        if "path" not in self.weights:
            return
        path = Path(self.weights["path"])
        if path.is_dir():
            folder = vae_folder(path)
            self.check_folder_config(folder)
            files = sorted(folder.glob("*.safetensors"))
            if not files:
                raise FarmError(f"{folder}: holds no .safetensors file; expected the audio VAE as "
                                "save_pretrained writes it (config.json + "
                                "diffusion_pytorch_model.safetensors)")  # fmt: skip
            return
        names = file_tensor_names(path)
        if not any(n.startswith(DECODE_PREFIXES) for n in names):
            raise FarmError(f"{path}: holds no audio VAE decoder tensors ({', '.join(DECODE_PREFIXES)}, "
                            f"bare or under {CHECKPOINT_PREFIX!r}); give MiniMax-H3's audio VAE")  # fmt: skip
        missing = [k for k in STATISTICS if self.full_config[k] is None]
        if missing:
            raise FarmError(f"{path}: a single file carries no latent statistics and {self.describe()} gives "
                            f"no {' or '.join(missing)}; give the audio VAE's folder (its config.json has "
                            "them) or a config with latents_mean and latents_std")  # fmt: skip

    def check_folder_config(self, folder: Path) -> None:
        """Refuse a folder whose config.json builds another model than the spec's config (the statistics
        are the folder's own)."""
        try:
            found = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise FarmError(f"{folder / 'config.json'}: cannot read it as JSON ({exc})") from None
        theirs = {**DEFAULTS, **{k: v for k, v in found.items() if not k.startswith("_")}}
        differ = [f"{k}: spec {v!r}, folder {theirs.get(k)!r}" for k, v in self.full_config.items()
                  if k not in STATISTICS and _plain(v) != _plain(theirs.get(k))]  # fmt: skip
        if differ:
            raise FarmError(f"{folder}: its config.json contradicts {self.describe()}: "
                            + "; ".join(differ[:4]) + ". Use the audio config of the folder's model, or give "
                            "its arguments as config.json says them")  # fmt: skip

    # ---- decoding (worker side: torch and diffusers imported here only) ------------------------------

    def build_decoder(self, device: str) -> MiniMaxH3AudioDecoder:
        return MiniMaxH3AudioDecoder(build_model(self), device)

    @classmethod
    def spec_from_pipeline(cls, pipeline: Any, weights: str | None) -> dict[str, Any]:
        vae = pipeline.audio_vae
        config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
        source = weights or str(vae.config.get("_name_or_path") or "")
        if not weights and not (source and (Path(source) / "config.json").is_file()):
            raise FarmError("the pipeline's audio VAE was not loaded from a local folder: pass "
                            "audio_weights= (its folder, as save_pretrained writes it, or a .safetensors "
                            "file) or audio_decoder= (a spec)")  # fmt: skip
        return {"family": FAMILY, "config": _plain(config), "weights": {"path": source}, "dtype": "float32"}


def _plain(value: Any) -> Any:
    """Tuples as lists, so a config read from JSON compares equal to one built in Python."""
    return json.loads(json.dumps(value))


def vae_folder(path: Path) -> Path:
    """The audio VAE's diffusers folder: `path`, or its ``audio_vae/`` (a pipeline folder)."""
    for folder in (path, path / "audio_vae"):
        if (folder / "config.json").is_file():
            return folder
    raise FarmError(f"{path}: no config.json in it or in {path / 'audio_vae'}; give the audio VAE's "
                    "folder (save_pretrained), the pipeline folder holding audio_vae/, or a .safetensors "
                    "file")  # fmt: skip


def file_tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as fh:
            return list(fh.keys())
    except Exception as exc:  # safetensors raises its own types for files that are not safetensors
        raise FarmError(f"{path}: cannot read it as safetensors ({type(exc).__name__}: {exc})") from None


def build_model(spec: MiniMaxH3AudioSpec) -> Any:
    """The audio VAE of `spec`, weights loaded, float32, in eval mode, on the CPU."""
    import torch
    from diffusers import AutoencoderKLMiniMaxH3Audio
    from safetensors.torch import load_file

    path = Path(spec.weights["path"]) if "path" in spec.weights else None
    if path is None:
        torch.manual_seed(int(spec.weights["random_seed"]))
        return AutoencoderKLMiniMaxH3Audio(**spec.config).eval()  # type: ignore[attr-defined]
    if path.is_dir():  # the folder's config (its statistics included); from_pretrained needs `accelerate`
        folder = vae_folder(path)
        model = AutoencoderKLMiniMaxH3Audio.from_config(AutoencoderKLMiniMaxH3Audio.load_config(folder))
        state = {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}
    else:
        model = AutoencoderKLMiniMaxH3Audio(**spec.config)
        state = {k.removeprefix(CHECKPOINT_PREFIX): v for k, v in load_file(path).items()}
    wanted = model.state_dict()
    missing = sorted(k for k in wanted if k not in state and k.startswith(DECODE_PREFIXES))
    unknown = sorted(set(state) - set(wanted))
    if missing or unknown:
        raise FarmError(f"{path}: the weights do not fit the audio config: missing {missing[:5]}, unexpected "
                        f"{unknown[:5]}; check the audio config")  # fmt: skip
    model.load_state_dict(state, strict=False)
    return model.float().eval()


class MiniMaxH3AudioDecoder:
    """The audio VAE on one device: `decode` turns one shot's audio latent into stereo sound."""

    def __init__(self, model: Any, device: str) -> None:
        self.model, self.device = model.to(device), device
        self._lock = threading.Lock()

    @property
    def sample_rate(self) -> int:
        return int(self.model.config.sampling_rate)

    def denormalize(self, latent: Any) -> Any:
        """``MiniMaxH3AudioDecodeStep``: ``z * latents_std + latents_mean`` per latent channel."""
        import torch

        config = self.model.config
        if config.latents_mean is None and config.latents_std is None:  # RANDOM weights without statistics
            return latent
        mean = torch.tensor(config.latents_mean, device=latent.device).view(1, -1, 1)
        std = torch.tensor(config.latents_std, device=latent.device).view(1, -1, 1)
        return latent * std + mean

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """One shot's audio latent ``[2, C, T]`` (normalized) → waveform ``[2, T * hop]``, float32 in
        [-1, 1]."""
        import torch

        z = torch.from_numpy(np.ascontiguousarray(latent, np.float32)).to(self.device)
        with self._lock, torch.inference_mode():
            audio = self.model.decode(self.denormalize(z), return_dict=False)[0]  # [2, 1, samples]
            return audio.float().permute(1, 0, 2)[0].cpu().numpy()
