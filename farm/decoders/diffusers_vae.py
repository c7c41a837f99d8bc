"""The common part of farm's adapters over diffusers video VAEs: build, load weights, decode a tile.

An adapter subclasses :class:`DiffusersVideoDecoder` and says what differs for its model:

* ``family``, ``named_configs`` and ``model_class_name`` (the diffusers class, imported lazily);
* ``geometry_for`` / ``latent_channels_for`` from a config;
* ``denormalize`` (what the model's pipeline does to latents before ``vae.decode``, applied when the
  spec says ``"latents": "normalized"``) and ``run_decoder`` (the ``vae.decode`` call itself);
* ``required_weights`` (state-dict prefixes the decoder needs), ``unused_modules`` (dropped after
  loading so a GPU holds only the decoder), and the memory estimates ``peak_bytes``/``weight_bytes``.

``decode`` turns a latent tile ``[C, f, h, w]`` into pixels ``[3, F, H, W]`` in nominally [0, 1]. Its
optional ``origin`` (the tile's first latent frame, row and column in the shot) is for decoders whose
output depends on where a tile sits, e.g. noise drawn per latent position; others ignore it.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders import weights as W
from farm.decoders.base import DEFAULT_SPATIAL_OVERLAP, RECEPTIVE_FIELD_CONTEXT, DecoderSpec, dtype_bytes
from farm.decoders.checkpoints import (
    SAFETENSORS_SUFFIX,
    Derived,
    Layout,
    TensorInfo,
    file_vae_config,
    safetensors_header,
)
from farm.decoders.geometry import Geometry
from farm.decoders.launch_pacing import LaunchPacer, launch_lead, pace_launches
from farm.decoders.memory import MemoryModel
from farm.decoders.recording import recorded_constructor_defaults, recorded_decoder_parameters
from farm.decoders.reflect_pad import sliced_reflect_padding
from farm.errors import FarmError

if TYPE_CHECKING:
    import numpy as np
    import torch


def live_constructor_defaults(class_name: str) -> dict[str, Any]:
    """The same, read from the installed class (imports diffusers), in the recording's JSON form."""
    import json

    model_cls = getattr(importlib.import_module("diffusers"), class_name)
    return json.loads(json.dumps(W.constructor_defaults(model_cls)))


def assert_materialised(model: Any, where: str) -> None:
    """Refuse a model built on the meta device that still holds a meta tensor (a parameter or buffer,
    persistent or not, or a tensor attribute) after its weights were loaded."""
    import torch

    left = [f"{m}.{k}".lstrip(".") for m, module in model.named_modules()
            for k, v in [*module._parameters.items(), *module._buffers.items(),
                         *((k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor))]
            if isinstance(v, torch.Tensor) and v.is_meta]  # fmt: skip
    if left:
        raise FarmError(
            f"decoder from {where}: {len(left)} tensors were not loaded ({', '.join(left[:3])}); the weights "
            "lack them and farm does not initialise decoder tensors itself"
        )


def _for_dtype(table: dict[str, Any], dtype: str | None, otherwise: Any) -> Any:
    """A per-dtype measurement: the dtype's own; float16 shares bfloat16's floor; else `otherwise`."""
    if dtype in table:
        return table[dtype]
    if dtype == "float16" and "bfloat16" in table:
        return table["bfloat16"]
    return otherwise


# The last build from weights in this process, step by step (`build_steps`): seconds to build the model on
# the meta device (diffusers' model code imported first, where it was not yet), and to read the weights,
# ahead (on a thread, beside that) or after it.
_build_steps: dict[str, float] = {}


def build_steps() -> dict[str, float]:
    """The seconds of this process's last decoder build from weights, per step."""
    return dict(_build_steps)


class DiffusersVideoDecoder:
    family: ClassVar[str]
    named_configs: ClassVar[dict[str, dict[str, Any]]]
    model_class_name: ClassVar[str]  # a class exported by `diffusers`
    # Named configs farm once resolved to other constructor arguments: their current revision, and what
    # changed (`farm.decoders.base.named_config_revision`); configs never revised are absent.
    config_revisions: ClassVar[dict[str, int]] = {}
    config_revision_notes: ClassVar[dict[str, str]] = {}
    required_weights: ClassVar[tuple[str, ...]] = W.DECODER_PREFIXES
    # Latent statistics the weights carry as tensors (LTX): needed to un-normalise latents only.
    statistics_tensors: ClassVar[tuple[str, ...]] = ()
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder",)
    # Peak device memory above the weights per output pixel-frame of one decode call, at 2-byte dtypes.
    bytes_per_pixel_frame: ClassVar[float] = 120.0
    # config → peak memory of one float32 decode call on a CPU as `farm.decoders.memory.MemoryModel`'s terms
    # (bytes_per_pixel, and where fitted const_bytes, bytes_per_frame_pixel, native_conv), measured and
    # fitted by `tools/measure_families.py --fit`; configs without an entry use the estimate above
    memory_measured: ClassVar[dict[str, dict[str, Any]]] = {}
    # the terms that fit fits (`farm.planning.costmodel.fit_memory`)
    memory_fit_terms: ClassVar[tuple[str, ...]] = ("const_bytes", "bytes_per_pixel")
    # config → how far its `memory_measured` fit may fall short of a measured peak, as a fraction: its terms
    # are raised by it (a fit through measured peaks is no bound on them, and tiles are planned to a budget)
    memory_fit_error: ClassVar[dict[str, float]] = {}
    # config → (machine kind "h200" or "cpu", pixel frames/height/width, seconds of one decode call): what
    # `farm.planning.costmodel.cost_model` scales a stored cost model's decode seconds by
    decode_seconds_measured: ClassVar[dict[str, tuple[str, tuple[int, int, int], float]]] = {}
    # Extra spec fields the adapter reads: name → (accepted types, what to write in an error message).
    spec_fields: ClassVar[dict[str, tuple[tuple[type, ...], str]]] = {}
    # How the family's latents reach farm (`farm.inputs` builds its tables from these, so a family is
    # declared in one place): diffusers pipeline classes whose VAE this adapter decodes → (the latents
    # their ``output_type="latent"`` returns, "normalized" or "denormalized"; packed as a token sequence),
    # what ComfyUI's .latent files hold for the family (None: ComfyUI saves none farm reads), and the
    # words of a ComfyUI workflow's node types and model file names that point to the family.
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {}
    # the axes of those pipelines' unpacked latents, in words (`from_pipeline_output` makes them
    # [B, C, F, H, W], what their decode hands `vae.decode`)
    pipeline_layout: ClassVar[str] = "[B, C, F, H, W]"
    # Pipelines among those whose ``output_type="latent"`` latents are not ``[B, C, F, H, W]`` → the order of
    # their axes in those letters (e.g. "BFHWC": channels last); `farm.inputs.pipelines` moves them.
    pipeline_latent_axes: ClassVar[dict[str, str]] = {}
    comfyui_latents: ClassVar[str | None] = None
    comfyui_words: ClassVar[tuple[str, ...]] = ()
    # named video config → the named sound config that goes with it (`farm synth --audio`)
    sound_configs: ClassVar[dict[str, str]] = {}

    @classmethod
    def spec_fields_from_pipeline(cls, pipeline: Any) -> dict[str, Any]:
        """The extra spec fields (`spec_fields`) a diffusers pipeline instance of this family says for
        itself, which its un-normalisation reads outside the VAE (e.g. its scheduler's settings); recorded
        in the spec `farm.inputs.pipelines.spec_from_pipeline` makes."""
        return {}

    def __init__(self, spec: DecoderSpec, model: Any, device: str) -> None:
        import torch

        self.spec = spec
        self.model = model
        self.device = device
        self.torch_dtype = getattr(torch, spec.dtype)
        self.geometry = self.geometry_for_spec(spec)
        self.latent_channels = self.latent_channels_for(spec.config)
        self._lock = threading.Lock()  # one decode at a time per model (adapters may keep per-call state)
        self.pacer: LaunchPacer | None = None  # set by `load` on a GPU (`farm.decoders.launch_pacing`)

    # ---- shapes --------------------------------------------------------------------------------

    @classmethod
    def for_spec(cls, spec: DecoderSpec) -> type[DiffusersVideoDecoder]:
        """The adapter class that decodes `spec` (a family whose diffusers class the spec names gives a
        class of its own per name); by default the family's class itself."""
        return cls

    @classmethod
    def unnamed_config(cls, raw: dict[str, Any], where: str) -> dict[str, Any] | None:
        """The config of a spec that gives no ``config`` (a family that reads it from the weights), or None:
        the family's name is then a named config."""
        return None

    @classmethod
    def plan_note(cls, spec: DecoderSpec) -> str | None:
        """A line `farm plan` shows under the decoder (what the family decodes differently), or None."""
        return None

    @classmethod
    def model_class(cls) -> type:
        """The diffusers class, imported now (with diffusers' logging held to errors: a cast of a model
        with no fp32-only modules warns anyway)."""
        importlib.import_module("diffusers.utils.logging").set_verbosity_error()
        return getattr(importlib.import_module("diffusers"), cls.model_class_name)

    @classmethod
    def _full_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """`config` completed with the model class's constructor defaults: recorded for the installed
        diffusers (planning then never imports it), else read from the class."""
        recorded = recorded_constructor_defaults(cls)
        if recorded is not None:
            return {**recorded, **config}
        return W.full_config(cls.model_class(), config)

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        raise NotImplementedError

    @classmethod
    def latent_channels_for(cls, config: dict[str, Any]) -> int:
        return int(cls._full_config(config)[cls.latent_channels_key])

    latent_channels_key: ClassVar[str] = "latent_channels"  # the config entry holding the latent channels

    # Latent frames a temporal tile decodes before (context) and after (lookahead) its own, then discards,
    # so the frames it keeps match a whole-shot decode: per named config, measured with random weights as
    # the fewest frames that bring every kept frame within half a level of the whole decode
    # (`benchmarks/measure_seams.py context`; the receptive field is the architecture's, not the weights').
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {}

    @classmethod
    def temporal_context_for(cls, config: dict[str, Any]) -> tuple[int, int]:
        """(context, lookahead) latent frames for a config: its named config's, else the family's largest
        (a custom config's receptive field is unknown; the largest recorded one errs on the safe side)."""
        name = cls._named(config)
        if name in cls.temporal_context:
            return cls.temporal_context[name]
        values = list(cls.temporal_context.values())
        return (max((c for c, _ in values), default=0), max((a for _, a in values), default=0))

    # Spatial overlap (latent units) where a plan splits height or width and the user gave none (explicit
    # tiles and `--tiles auto` alike): per named config, the least whose seam meets
    # `farm.decoders.base.SEAM_TARGET_DB` on both axes, measured with RANDOM weights by
    # `benchmarks/measure_seams.py spatial` (docs/fidelity.md). Configs not measured use
    # `farm.decoders.base.DEFAULT_SPATIAL_OVERLAP` (LTX-2's shipped overlap).
    spatial_overlap: ClassVar[dict[str, int]] = {}

    @classmethod
    def spatial_overlap_for(cls, config: dict[str, Any]) -> int:
        """The default spatial overlap for a config: its named config's measured one, else the default."""
        if cls.halo_is_exact(config):
            return 0  # the halo makes each tile exact: blending would only add decode work
        return cls.spatial_overlap.get(cls._named(config) or "", DEFAULT_SPATIAL_OVERLAP)

    # Spatial halo (latent rows and columns a tile decodes beyond each side that has a neighbour, then
    # discards): per named config and dtype, the least at which a tile's own pixels equal the untiled
    # decode to the dtype's noise floor (bfloat16 and float16: >= 50 dB over the seam band, no pixel more
    # than 8 levels off; float32: >= 70 dB), measured with RANDOM weights by `benchmarks/measure_halo.py`
    # (docs/fidelity.md "Halo"). A dtype not measured takes the config's largest; a config not measured,
    # the family's largest (its reach is unknown).
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {}
    # Named configs whose halo alone reaches the floor; the others keep blending at `spatial_overlap`
    # beside their halo (a part of the decoder sees the whole frame, which no halo reaches).
    halo_exact: ClassVar[frozenset[str]] = frozenset()
    # Temporal context measured per dtype like the halo, where it is less than `temporal_context` (the
    # receptive field): a temporal tile of that dtype decodes only this much.
    measured_context: ClassVar[dict[str, dict[str, tuple[int, int]]]] = {}

    @classmethod
    def spatial_halo_for(cls, config: dict[str, Any], dtype: str | None = None) -> int:
        """Latent rows and columns of halo for a config (and dtype): measured, else the largest known."""
        name = cls._named(config)
        table = cls.spatial_halo.get(name or "")
        if table is None:
            return max((m for t in cls.spatial_halo.values() for m in t.values()), default=0)
        return _for_dtype(table, dtype, max(table.values()))

    @classmethod
    def geometry_for_spec(cls, spec: DecoderSpec) -> Geometry:
        """`geometry_for` the spec's config, with the halo and temporal context measured for its dtype (the
        whole receptive field where the spec's "context" asks for it)."""
        geometry = cls.geometry_for(spec.config)
        halo = cls.spatial_halo_for(spec.config, spec.dtype)
        measured = cls.measured_context.get(cls._named(spec.config) or "", {})
        if spec.extra.get("context") == RECEPTIVE_FIELD_CONTEXT:
            measured = {}
        context = _for_dtype(measured, spec.dtype, (geometry.context, geometry.lookahead))
        return replace(geometry, halo=halo, context=context[0], lookahead=context[1])

    @classmethod
    def halo_is_exact(cls, config: dict[str, Any]) -> bool:
        """Whether the config's halo alone brings its tiles to the untiled decode (no blend needed)."""
        return cls._named(config) in cls.halo_exact

    @classmethod
    def _named(cls, config: dict[str, Any]) -> str | None:
        return next((name for name, named in cls.named_configs.items() if named == config), None)

    @classmethod
    def _with_context(cls, geometry: Geometry, config: dict[str, Any]) -> Geometry:
        context, lookahead = cls.temporal_context_for(config)
        return replace(geometry, context=context, lookahead=lookahead, halo=cls.spatial_halo_for(config))


    @classmethod
    def decoder_parameters(cls, config: dict[str, Any]) -> int:
        """Parameters of the modules a decode uses: recorded for a named config, else counted on the meta
        device (no memory, no weights)."""
        name = next((n for n, c in cls.named_configs.items() if c == config), None)
        recorded = recorded_decoder_parameters(cls, name) if name else None
        return recorded if recorded is not None else cls.count_decoder_parameters(config)

    @classmethod
    def count_decoder_parameters(cls, config: dict[str, Any]) -> int:
        return sum(p.numel() for p in cls.meta_model(config).parameters())

    @classmethod
    def weight_bytes(cls, spec: DecoderSpec) -> int:
        return cls.decoder_parameters(spec.config) * dtype_bytes(spec.dtype)

    @classmethod
    def memory_terms(cls, spec: DecoderSpec) -> dict[str, Any]:
        """Peak memory of one decode call as `farm.decoders.memory.MemoryModel`'s terms: weights and bytes per
        output pixel-frame (adapters add a dense attention mask's bytes per pair of latent positions)."""
        per_pixel = cls.bytes_per_pixel_frame * cls._width_ratio(spec.config) * dtype_bytes(spec.dtype) / 2
        terms = {"weight_bytes": cls.weight_bytes(spec), "bytes_per_pixel": per_pixel}
        return cls._measured_terms(spec, terms)

    @classmethod
    def cpu_native_conv_channels(cls, config: dict[str, Any]) -> tuple[int, ...]:
        """Input channels of the 3x3x3 convolutions at full output resolution, over the whole clip at once
        (`farm.decoders.memory.MemoryModel.native_conv`); none by default."""
        return ()

    @classmethod
    def _measured_terms(cls, spec: DecoderSpec, terms: dict[str, Any]) -> dict[str, Any]:
        """`terms` with the config's measured terms in place of the estimate, where recorded (scaled to
        the spec's dtype): narrow configs keep per-pixel costs that do not shrink with their width (the
        float32 output and its conversion to [0, 1]), which the width-scaled figure misses several times."""
        measured = cls.memory_measured.get(spec.config_name or "")
        if measured is None:
            return terms
        scale = dtype_bytes(spec.dtype) / 4 * (1 + cls.memory_fit_error.get(spec.config_name or "", 0.0))
        out = {**terms, "bytes_per_pixel": 0.0}
        for name, value in measured.items():
            if name == "native_conv":
                out[name] = tuple((int(c), float(b) * scale) for c, b in value)
            else:
                out[name] = float(value) * scale
        return out

    @classmethod
    def peak_bytes(cls, spec: DecoderSpec, pixels: Sequence[int] | int) -> int:
        return MemoryModel.from_terms(cls.memory_terms(spec)).peak_bytes(pixels)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        """Width of the last decoder block relative to the real config's (activations scale with it)."""
        return 1.0

    # ---- spec ----------------------------------------------------------------------------------

    @classmethod
    def check_spec(cls, spec: DecoderSpec) -> None:
        """Refuse extra spec fields of the wrong type; adapters add checks against the config."""
        for name, (kinds, what) in cls.spec_fields.items():
            value = spec.extra.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise FarmError(f"decoder spec: {name!r} must be {what}, got {value!r}")

    # ---- loading -------------------------------------------------------------------------------

    @classmethod
    def build(cls, spec: DecoderSpec) -> Any:
        """The diffusers model for the spec's config in float32 on the CPU: seeded random weights (the
        whole model, built as diffusers initialises it), or the decoder loaded from the spec's weights."""
        import torch

        if not spec.random_weights:
            return cls.build_from_weights(spec, "cpu", "float32")
        model_cls = cls.model_class()
        try:
            torch.manual_seed(int(spec.weights["random_seed"]))
            model = model_cls(**spec.config)
        except (TypeError, ValueError, RuntimeError, AssertionError) as exc:
            raise FarmError(f"decoder config for {spec.family} is invalid: {exc}") from None
        cls._fix_compression_ratios(model, spec)
        return model.eval()

    @classmethod
    def build_from_weights(cls, spec: DecoderSpec, device: str, dtype: str | None = None) -> Any:
        """The decoder only, built on the meta device (no memory, no random initialisation; the encoder
        and other unused modules dropped) and given the weights' decoder tensors read straight onto
        `device` in `dtype` (default: the spec's). ``assign=True``: the tensors read become the
        parameters, with no second copy; none may be left on the meta device.

        For a named config the tensors are read on a thread while the model is built (`W.reading_ahead`):
        building imports the family's model module of diffusers (what a worker forked from
        `farm.run.worker_forkserver` has left to import), which the read then runs beside."""
        import torch

        _build_steps.clear()
        torch_dtype = getattr(torch, dtype or spec.dtype)
        recorded = W.recorded_tensors(spec, cls)
        with W.reading_ahead(spec, cls, recorded, device, torch_dtype) as ahead:
            started = time.perf_counter()
            model = cls.meta_model(spec.config)
            _build_steps["decoder model"] = time.perf_counter() - started
            expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            state = None
            if ahead is not None and expected == recorded:
                state = ahead.take()
                _build_steps["weights read ahead"] = ahead.seconds or 0.0
        if state is None:  # no recording, or one of another diffusers than this: read for this model
            started = time.perf_counter()
            state = W.read_decoder_state(spec, cls, expected, device, torch_dtype)
            _build_steps["weights read"] = time.perf_counter() - started
        for name in cls.statistics_tensors:  # not in the weights and not needed (denormalized latents):
            if name in expected and name not in state:  # NaN, so that a use would show
                state[name] = torch.full(expected[name], float("nan"), device=device, dtype=torch_dtype)
        model.load_state_dict(state, strict=False, assign=True)
        cls.materialise_derived_buffers(model, device)
        assert_materialised(model, where=spec.weights["path"])
        cls._fix_compression_ratios(model, spec)
        return model.eval()

    @classmethod
    def materialise_derived_buffers(cls, model: Any, device: str) -> None:
        """Give a model built on the meta device the non-persistent buffers its constructor computes (no
        weights file carries them), on `device`; by default there are none."""

    @classmethod
    def meta_model(cls, config: dict[str, Any]) -> Any:
        """The model for `config` on the meta device, its unused modules (the encoder) dropped."""
        import torch

        try:
            with torch.device("meta"):
                model = cls.model_class()(**config)
        except (TypeError, ValueError, RuntimeError, AssertionError) as exc:
            raise FarmError(f"decoder config for {cls.family} is invalid: {exc}") from None
        for name in cls.unused_modules:
            setattr(model, name, torch.nn.Identity())
        return model

    @classmethod
    def decoder_tensor_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the tensors a decode uses (what `farm.decoders.weights` checks weights
        against), from the model built on the meta device."""
        return {k: tuple(v.shape) for k, v in cls.meta_model(config).state_dict().items()}

    @classmethod
    def _fix_compression_ratios(cls, model: Any, spec: DecoderSpec) -> None:
        # diffusers derives LTX-2's ratios from the encoder's levels, counting each as spatial and
        # temporal (64/16 where the model scales 32/8), and its own tiling then cuts wrong-sized clips
        g = cls.geometry_for(spec.config)
        for attr, value in (("spatial_compression_ratio", g.spatial_scale),
                            ("temporal_compression_ratio", g.temporal_scale)):  # fmt: skip
            current = vars(model).get(attr)  # an attribute the model sets, else its config's (read there:
            if current is None:  # diffusers deprecates reading a config entry off the model)
                config = getattr(model, "config", None)
                current = config.get(attr) if isinstance(config, dict) else None
            if current not in (None, value):
                setattr(model, attr, value)

    @classmethod
    def load(cls, spec: DecoderSpec, device: str) -> DiffusersVideoDecoder:
        """The decoder for `spec` on `device`: random weights as :meth:`build` makes them (then cast), or
        the weights' decoder tensors loaded straight onto the device (:meth:`build_from_weights`)."""
        cls.check_spec(spec)
        model = cls.build(spec) if spec.random_weights else cls.build_from_weights(spec, device)
        return cls.from_model(spec, model, device)

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> DiffusersVideoDecoder:
        """The decoder around a diffusers `model` of the spec's config (moved to `device` and the spec's
        dtype where it is not there yet); adapters add what their decode needs."""
        import torch

        for name in cls.unused_modules:  # decode only: don't hold the encoder's weights on the GPU
            if not isinstance(getattr(model, name, None), torch.nn.Identity):
                setattr(model, name, torch.nn.Identity())
        model.to(device=device, dtype=getattr(torch, spec.dtype))
        sliced_reflect_padding(model)  # the same padded tensors as F.pad's, in a fraction of its GPU time
        decoder = cls(spec, model, device)
        decoder.pace(launch_lead())
        return decoder

    def pace(self, lead: int) -> None:
        """Queue eager GPU decodes at most `lead` convolutions ahead of the GPU (0: unpaced), from the
        next decode on (`farm.decoders.launch_pacing`). The hooks go in at the first lead above 0, so an
        unpaced decoder runs as measured; on a CPU there is nothing to pace."""
        if self.pacer is None and lead:
            self.pacer = pace_launches(getattr(self.model, "decoder", self.model), lead)
        if self.pacer is not None:
            self.pacer.lead = lead

    @classmethod
    def from_pipeline_output(cls, pipeline: Any, data: np.ndarray, num_frames: int | None) -> np.ndarray:
        """A pipeline's unpacked ``output_type="latent"`` latents (`pipeline_layout`, a batch axis first)
        → ``[B, C, F, H, W]`` as its decode hands them to ``vae.decode``, before un-normalising; `pipeline`
        is the instance or its class name, `num_frames` what it was called with (None: not given). By
        default they are so already."""
        return data

    # ---- checkpoint layouts ----------------------------------------------------------------------
    # A family whose released checkpoints are not in diffusers' layout says how to read them: which of its
    # layouts a file's names are in, the original name of each diffusers tensor, which configs a layout can
    # name, diffusers' converter for it, and tensors the file holds only as parts of others
    # (`farm.decoders.checkpoints.detect_layout` and `farm.decoders.weights` call these).

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        """The family's original layout that a checkpoint's VAE tensor names (a file's prefix removed) are
        in, or None: diffusers' layout (or no layout of this family's)."""
        return None

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        """The name diffusers' tensor `name` has in `layout` (without a file's prefix)."""
        if layout == "diffusers":
            return name
        raise ValueError(f"the {cls.family} decoder reads no {layout!r} layout")

    @classmethod
    def check_layout_fits(cls, layout: str, full_config: dict[str, Any], where: str) -> None:
        """Refuse an original layout whose fixed numbering cannot name this config's tensors."""

    @classmethod
    def convert_names(cls, layout: Layout, tensors: dict[str, Any], missing: Any) -> dict[str, Any]:
        """diffusers' own converter for an original `layout`, run on name-and-shape stand-ins (`tensors`,
        by their names in the file; `missing` stands for a tensor the file lacks): diffusers' names → the
        stand-ins. Empty where diffusers has no converter (`original_name` names the tensors then)."""
        return {}

    @classmethod
    def file_tensors(
        cls, infos: dict[str, TensorInfo], layout: Layout, files: list[Path], full_config: dict[str, Any],
        where: str,
    ) -> tuple[dict[str, TensorInfo], dict[str, Derived]]:
        """A checkpoint's tensors as the decoder's modules take them, and how each tensor the file holds
        only as part of others is read (`farm.decoders.checkpoints.Derived`); by default, as they are."""
        return infos, {}

    @classmethod
    def file_decoder_config(cls, vae: dict[str, Any], where: str) -> dict[str, Any] | None:
        """The decoder settings a single file's ``config`` → ``vae`` metadata gives, in diffusers' terms
        (adapters whose checkpoints carry one, as their reference implementation reads it); None: the
        family's files carry none farm reads."""
        return None

    @staticmethod
    def config_contradictions(file_config: dict[str, Any], full_config: dict[str, Any]) -> list[str]:
        """The settings where a job's (completed) config differs from a file's, in words."""

        def norm(v: Any) -> Any:
            return [norm(x) for x in v] if isinstance(v, list | tuple) else v

        return [
            f"{k}: the file has {norm(v)!r}, the job's config {norm(full_config.get(k))!r}"
            for k, v in file_config.items()
            if norm(v) != norm(full_config.get(k))
        ]

    @classmethod
    def check_file_config(cls, spec: DecoderSpec, files: list[Path]) -> None:
        """Refuse a single file whose own config (:meth:`file_decoder_config`) describes another decoder
        than the spec's, naming each field and the named config that fits the file (a diffusers folder's
        ``config.json`` is checked for every family, by `farm.decoders.weights`)."""
        full = cls._full_config(spec.config)
        for f in files:
            if not f.name.endswith(SAFETENSORS_SUFFIX):
                continue
            vae = file_vae_config(f, safetensors_header(f)[0])
            file_config = None if vae is None else cls.file_decoder_config(vae, str(f))
            if not file_config:
                continue
            differences = cls.config_contradictions(file_config, full)
            if not differences:
                continue
            fits = [name for name, config in cls.named_configs.items()
                    if not cls.config_contradictions(file_config, cls._full_config(config))]  # fmt: skip
            hint = (f"the file is {' / '.join(fits)}: use that config" if fits
                    else "give the file's config as the spec's config")  # fmt: skip
            raise FarmError(
                f"weights file {str(f)!r} carries a decoder config that contradicts the job's "
                f"({spec.config_name or 'custom config'}): " + "; ".join(differences) + f"; {hint}"
            )

    @classmethod
    def check_weights(cls, spec: DecoderSpec) -> DecoderSpec:
        """Refuse weights that do not fit the spec or changed since it recorded them (headers only; see
        `farm.decoders.weights.check_weights`); the spec with the weights' layout and identity recorded."""
        cls.check_spec(spec)
        return W.check_weights(spec, cls)

    def enable_compile(self, mode: str | None = None) -> None:
        import torch

        # inductor makes one kernel of F.pad's reflect padding; the slices would be traced as copies
        sliced_reflect_padding(self.model, on=False)
        self.model.decoder = torch.compile(self.model.decoder, mode=mode)

    # ---- decoding ------------------------------------------------------------------------------

    @classmethod
    def carried_state_bytes(cls, spec: DecoderSpec, latent_hw: tuple[int, int]) -> int:
        """Bytes of the decoder state a carried chunk hands on: none, for decoders that do not carry."""
        return 0

    def decode_carried(
        self, latent: torch.Tensor, state: Any, origin: tuple[int, int, int] | None = None
    ) -> tuple[torch.Tensor, Any]:
        raise FarmError(f"the {self.family} decoder cannot carry its causal state between temporal chunks")

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """Latents as the pipeline stores them → as it hands them to ``vae.decode``."""
        raise NotImplementedError

    def denormalize_at(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """`denormalize` for a tile whose first latent frame, row and column in the shot are `origin`
        (None: the shot's start): for pipelines whose statistics differ per latent frame (Cosmos 1.0)."""
        return self.denormalize(z)

    def denormalize_with_buffers(self, z: torch.Tensor) -> torch.Tensor:
        """The LTX pipelines' ``_denormalize_latents``: ``z * std / scaling_factor + mean``, with the
        mean and std buffers the weights carry."""
        mean = self.model.latents_mean.view(1, -1, 1, 1, 1).to(z)
        std = self.model.latents_std.view(1, -1, 1, 1, 1).to(z)
        return z * std / self.model.config.scaling_factor + mean

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """``vae.decode`` of a batch of one ``[1, C, f, h, w]`` → ``[1, 3, F, H, W]`` in [-1, 1]."""
        return self.model.decode(z, return_dict=False)[0]

    def decoder_input(
        self, latent: torch.Tensor, origin: tuple[int, int, int] | None = None
    ) -> torch.Tensor:
        """Latent tile ``[C, f, h, w]`` → what ``vae.decode`` takes: a batch of one on the decoder's
        device and dtype, denormalized when the job stores normalized latents. Copied to a GPU without
        waiting for kernels already queued (the previous decode's, which a plain copy from pageable
        memory would wait for, so the next decode's launches could not queue behind it): through pinned
        memory (a latent read ahead comes pinned). When nothing is queued, a plain copy waits for
        nothing and spares the pinning (before a carried shot's first chunk on an H200: 18 ms pinned,
        1 ms plain; docs/performance.md)."""
        if str(self.device).startswith("cuda"):
            import torch

            if latent.is_cuda or (not latent.is_pinned() and torch.cuda.current_stream(self.device).query()):
                z = latent.to(device=self.device)  # on a GPU already, or an idle stream: nothing to wait for
            else:
                z = latent.pin_memory().to(device=self.device, non_blocking=True)
            z = z.to(self.torch_dtype)[None]
        else:
            z = latent.to(dtype=self.torch_dtype)[None]
        return self.denormalize_at(z, origin) if self.spec.latents == "normalized" else z

    @staticmethod
    def unit_pixels(pixels: torch.Tensor) -> torch.Tensor:
        """The decoder's ``[3, F, H, W]`` output in [-1, 1] → float32, nominally [0, 1] (clamped at
        uint8 time)."""
        return (pixels.float() + 1.0) / 2.0

    def decode(self, latent: torch.Tensor, origin: tuple[int, int, int] | None = None) -> torch.Tensor:
        import torch

        with self._lock, torch.inference_mode():
            return self.unit_pixels(self.run_decoder(self.decoder_input(latent, origin), origin)[0])

    # ---- the part of the decoder that sees the whole frame ----------------------------------------
    # A decoder whose early layers see the whole frame (a middle block's self-attention at latent
    # resolution) is split in two: `whole_frame` runs those layers once over a shot's whole frame, and
    # every tile decodes the rest from its block (plus halo) of that output (`decode_shared`), so no halo
    # has to reach across the frame. By default a decoder has no such part.

    @classmethod
    def shares_whole_frame(cls, config: dict[str, Any]) -> bool:
        """Whether tiles of this config decode from a whole-frame pass (`whole_frame`)."""
        return False

    @classmethod
    def whole_frame_in_one_call(cls, config: dict[str, Any]) -> bool:
        """Whether a tile decodes from the whole-frame pass only in one call (no temporal or spatial chunks
        of it): plans that chunk tiles then decode them from their latent, without the pass."""
        return False

    @classmethod
    def shares_statistics(cls, config: dict[str, Any]) -> bool:
        """Whether tiles of this config take the whole shot's GroupNorm statistics after the whole-frame
        pass, one round across the tiles per GroupNorm (`statistics_start`, `statistics_round`)."""
        return False

    @classmethod
    def statistics_exact(cls, config: dict[str, Any]) -> bool:
        """Whether the config's tiles, with its halo and the shot's statistics shared in rounds, are
        measured to equal the untiled decode to the dtype's noise (no blend needed where the rounds run)."""
        return False

    @classmethod
    def statistics_round_count(cls, config: dict[str, Any]) -> int:
        """The rounds a shot's tiles take when they share its statistics: one per GroupNorm."""
        return 0

    @classmethod
    def statistics_carried_bytes(cls, spec: DecoderSpec, pixel_frames: int) -> int:
        """Device memory a tile of `pixel_frames` decoded pixel-frames holds between rounds."""
        return 0

    def statistics_start(
        self, shared: torch.Tensor, own: Any, origin: tuple[int, int, int] | None = None
    ) -> tuple[Any, torch.Tensor]:
        """A tile's block of `whole_frame`'s output, its own latent block (tile-local) and the block's
        first latent frame, row and column in the shot (None: the shot's start) → what it carries to the
        first round, and its sums for that round's statistics."""
        raise FarmError(f"the {self.family} decoder shares no statistics")

    def statistics_round(self, carried: Any, stats: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """One round: normalise with the shot's `stats`, run to the next GroupNorm → what the tile carries
        and its sums there; after the last, the tile's pixels ``[3, F, H, W]`` (as `decode`) and None."""
        raise FarmError(f"the {self.family} decoder shares no statistics")

    def whole_frame_part(self, z: torch.Tensor) -> torch.Tensor:
        """``vae.decode``'s input ``[1, C, f, h, w]`` → the shared part's output ``[1, C', f, h, w]``."""
        raise FarmError(f"the {self.family} decoder has no whole-frame part")

    def rest_of_decoder(self, shared: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """A block of `whole_frame_part`'s output → ``[1, 3, F, H, W]`` in [-1, 1], as ``vae.decode``."""
        raise FarmError(f"the {self.family} decoder has no whole-frame part")

    def whole_frame(self, latent: torch.Tensor) -> torch.Tensor:
        """A shot's latent ``[C, f, h, w]`` over the whole frame → the shared part's output
        ``[C', f, h, w]`` (latent frames, rows and columns as the latent's), in the decoder's dtype, on
        the CPU (it travels to the tile tasks)."""
        import torch

        with self._lock, torch.inference_mode():
            return self.whole_frame_part(self.decoder_input(latent))[0].to("cpu")

    def decode_shared(self, shared: torch.Tensor, origin: tuple[int, int, int] | None = None) -> torch.Tensor:
        """A tile's block (halo and context included) of `whole_frame`'s output → its pixels, as `decode`
        gives them for the same block of latent, but with the whole frame seen where the decoder sees it."""
        import torch

        with self._lock, torch.inference_mode():
            z = shared.to(device=self.device, dtype=self.torch_dtype)[None]
            return self.unit_pixels(self.rest_of_decoder(z, origin)[0])
