"""What the tasks of a render cost on one kind of machine: decode seconds, transfers, blends, memory.

Pure: numbers in, numbers out (numpy for the least-squares fit; no torch, no Dask, no device). A cost
model is data, fitted from measured decodes and stored as JSON in ``farm/planning/costmodels/<name>.json``
with the machine and date it came from; :func:`load` reads one, :func:`fit_decode_cost` fits the decode part
from ``(pixel shape, seconds)`` samples.

The decode time of a tile with pixel shape ``(f, h, w)`` is a non-negative combination of features::

    seconds = const + pixel_volume * (f*h*w) + halo * 2*(f*h + f*w + h*w)

``const`` is what a decode call costs whatever its size (kernel launches, small layers), ``pixel_volume``
the work per output pixel-frame and ``halo`` work that grows with the tile's surface (padding at its
borders). The fit minimises relative error, so small tiles weigh as much as whole shots.

Everything else a render does is charged per task or per pixel:

* ``task_overhead_s``: scheduling and latent read per decode or blend task;
* ``blend_s_per_pixel``: summing pre-weighted pieces into a batch and converting it to uint8 on the
  host, per pixel-frame of every piece summed;
* ``write_s_per_pixel`` / ``encode_s_per_pixel``: writing a batch to Zarr / encoding its video segment,
  per output pixel-frame (separate tasks on the blending worker); the encode figures are for the codec,
  preset and frames of ``encode_reference`` (`farm.planning.encode_cost.for_encoding` scales them to others);
* ``cores_encode_s_per_pixel`` / ``cores_write_s_per_pixel``: the cores that come with one decode worker
  (the measured host's, for its GPUs), which take every encode and Zarr write together at these rates per
  output pixel-frame: x264's threads fill the cores, so encodes and writes at once share them; a node has
  its decode workers' cores (0: no such limit);
* ``shot_overhead_s``: per shot (joining segments into the mp4, and what else a shot costs once);
* ``threads_per_worker``: Dask task threads per worker (decodes still take the GPU one at a time);
* ``disk_s_per_pixel``: a node's disk, which takes farm's durable (fsync'd) Zarr writes one batch after
  another at this rate per output pixel-frame, however many streams write (0: no such limit); a write
  ends when both its stream and the disk are done with it;
* ``send_s_per_pixel``: a blended batch's frames crossing from the worker that blended it to the I/O
  worker that writes it, per output pixel-frame; one worker sends one batch at a time (measured ≈ 0.06 s
  for 8 frames of 1088×1920 over UCX on an H200 node: host memory, not the GPU link);
* ``output_streams_per_worker`` / ``output_streams_per_node``: how many write or encode tasks one worker
  process (bound by its interpreter) and one node (bound by its cores) run at the measured rate at
  once; more at once queue. With ``decode_on_host`` (CPU workers) decodes queue for the node's too;
* transfers of decoded pieces (float32 RGB: ``piece_bytes_per_pixel`` = 12) between workers:
  ``latency_s + bytes / bandwidth`` with separate bandwidths within a node and between nodes.

Memory: `farm.decoders.memory.MemoryModel` is the decoder adapter's own memory terms (weights + a fixed part +
bytes per output pixel-frame of one decode call and per pixel of one frame, torch's native CPU convolution
where it applies, or a dense attention mask's bytes per pair of latent positions where larger), read off
it once so the planner stays pure (`farm.decoders.memory_model`); :func:`fit_memory` fits the terms to
measured peaks (`tools/measure_families.py --fit`). Per family:
:func:`scaled_to` scales a stored model's decode seconds to a decoder config from one measured decode
of it (`farm.planning.costmodel.cost_model` reads that from the adapter).

Example:
    >>> m = load("ltx2-h200")
    >>> round(m.decode_seconds((121, 704, 1216)), 2)
    0.41
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from farm.decoders import DecoderSpec, decoder_class
from farm.errors import FarmError
from farm.planning.encode_cost import EncodeReference, encode_factor
from farm.planning.nnls import nnls

FEATURES = ("const", "pixel_volume", "halo")
PIECE_BYTES_PER_PIXEL = 12  # decoded tiles travel as float32 RGB


def features(pixel_fhw: Sequence[int]) -> dict[str, float]:
    """The decode-cost features of a block of ``(frames, height, width)`` output pixels."""
    f, h, w = (float(x) for x in pixel_fhw)
    return {"const": 1.0, "pixel_volume": f * h * w, "halo": 2.0 * (f * h + f * w + h * w)}


@dataclass(frozen=True)
class Sample:
    """One measured decode: the output pixel shape (frames, height, width) and its wall seconds."""

    pixels: tuple[int, int, int]
    seconds: float
    latent: tuple[int, int, int] | None = None
    what: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pixels": list(self.pixels), "seconds": self.seconds}
        if self.latent is not None:
            out["latent"] = list(self.latent)
        if self.what:
            out["what"] = self.what
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Sample:
        latent = raw.get("latent")
        return cls(
            pixels=tuple(int(x) for x in raw["pixels"]),  # type: ignore[arg-type]
            seconds=float(raw["seconds"]),
            latent=tuple(int(x) for x in latent) if latent is not None else None,  # type: ignore[arg-type]
            what=str(raw.get("what", "")),
        )


@dataclass(frozen=True)
class DecodeCost:
    """Seconds of one decode call as a non-negative combination of :func:`features`."""

    coefficients: dict[str, float]

    def seconds(self, pixel_fhw: Sequence[int]) -> float:
        x = features(pixel_fhw)
        return sum(c * x[name] for name, c in self.coefficients.items())


def fit_decode_cost(samples: Iterable[Sample], names: Sequence[str] = FEATURES) -> DecodeCost:
    """Fit decode seconds to the named features by non-negative least squares on relative error.

    Each sample's row is divided by its seconds, so the fit minimises the sum of squared relative
    errors: a 0.05 s tile is fitted as carefully as a 1.2 s shot.
    """
    rows = list(samples)
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise FarmError(f"unknown cost features {unknown}; choose from {list(FEATURES)}")
    if len(rows) < len(names):
        raise FarmError(
            f"fitting {len(names)} cost coefficients ({', '.join(names)}) needs at least {len(names)} "
            f"measured decodes; got {len(rows)}"
        )
    if any(s.seconds <= 0 for s in rows):
        raise FarmError("every measured decode needs a positive duration in seconds")
    a = np.array([[features(s.pixels)[n] / s.seconds for n in names] for s in rows])
    b = np.ones(len(rows))
    x = nnls(a, b)
    return DecodeCost({n: float(v) for n, v in zip(names, x, strict=True)})


def fit_report(cost: DecodeCost, samples: Iterable[Sample]) -> list[tuple[Sample, float, float]]:
    """Per sample: (sample, predicted seconds, relative error)."""
    out = []
    for s in samples:
        p = cost.seconds(s.pixels)
        out.append((s, p, p / s.seconds - 1.0))
    return out


@dataclass(frozen=True)
class Link:
    """Moving bytes between two workers with one protocol: within a node and between nodes."""

    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    latency_s: float = 0.0

    def seconds(self, nbytes: float, *, same_node: bool) -> float:
        if nbytes <= 0:
            return 0.0
        bw = self.intra_node_bytes_per_s if same_node else self.inter_node_bytes_per_s
        return self.latency_s + nbytes / bw


def fit_memory(samples: Iterable[tuple[Sequence[int], float]], names: Sequence[str]) -> dict[str, float]:
    """Fit peak bytes of decode calls ``((f, h, w), bytes)`` to non-negative ``const_bytes``,
    ``bytes_per_pixel`` and ``bytes_per_frame_pixel`` (those named), minimising relative error."""
    rows = list(samples)
    if len(rows) < len(names):
        raise FarmError(f"fitting {len(names)} memory terms needs at least {len(names)} measured peaks")
    columns = {"const_bytes": lambda f, h, w: 1.0, "bytes_per_pixel": lambda f, h, w: f * h * w,
               "bytes_per_frame_pixel": lambda f, h, w: h * w}  # fmt: skip
    a = np.array([[columns[n](*fhw) / peak for n in names] for fhw, peak in rows])
    x = nnls(a, np.ones(len(rows)))
    return {n: float(v) for n, v in zip(names, x, strict=True)}


@dataclass(frozen=True)
class CostModel:
    """A decoder on a machine: decode, task, blend, output and transfer costs, and worker memory."""

    name: str
    decoder: str  # the decoder config it was measured with ("ltx2", "ltx2-tiny")
    dtype: str
    machine: str
    date: str
    decode: DecodeCost
    task_overhead_s: float = 0.005
    blend_s_per_pixel: float = 0.0
    write_s_per_pixel: float = 0.0
    encode_s_per_pixel: float = 0.0
    shot_overhead_s: float = 0.0
    threads_per_worker: int = 1
    output_streams_per_worker: int = 1
    output_streams_per_node: int = 1
    disk_s_per_pixel: float = 0.0  # a node's disk for durable writes, one batch at a time (0: unlimited)
    cores_encode_s_per_pixel: float = 0.0  # one decode worker's share of a node's cores: encodes (0: none)
    cores_write_s_per_pixel: float = 0.0  # and Zarr writes, on the same cores (0: none)
    encode_reference: EncodeReference = EncodeReference()  # what the encode figures were measured on
    send_s_per_pixel: float = 0.0  # a blended batch sent to its I/O worker, one at a time per sender
    decode_on_host: bool = False  # CPU workers: decodes also queue for the node's streams (its cores)
    links: dict[str, Link] = field(default_factory=dict)
    protocol: str = "tcp"
    workers_per_node: int = 8
    worker_memory_bytes: int | None = None
    piece_bytes_per_pixel: int = PIECE_BYTES_PER_PIXEL
    samples: tuple[Sample, ...] = ()
    notes: tuple[str, ...] = ()

    def decode_seconds(self, pixel_fhw: Sequence[int]) -> float:
        return self.decode.seconds(pixel_fhw)

    def link(self, protocol: str | None = None) -> Link:
        name = protocol or self.protocol
        if name not in self.links:
            raise FarmError(
                f"cost model {self.name!r} has no transfer figures for protocol {name!r}; "
                f"it has {sorted(self.links)}"
            )
        return self.links[name]

    def transfer_seconds(self, nbytes: float, *, same_node: bool, protocol: str | None = None) -> float:
        return self.link(protocol).seconds(nbytes, same_node=same_node)

    def with_(self, **changes: Any) -> CostModel:
        """A copy with some figures changed (e.g. ``protocol="tcp"`` or ``encode_s_per_pixel=0``)."""
        from dataclasses import replace

        return replace(self, **changes)

    # ---- JSON ----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "decoder": self.decoder,
            "dtype": self.dtype,
            "machine": self.machine,
            "date": self.date,
            "decode": {"coefficients": self.decode.coefficients},
            "task_overhead_s": self.task_overhead_s,
            "blend_s_per_pixel": self.blend_s_per_pixel,
            "write_s_per_pixel": self.write_s_per_pixel,
            "encode_s_per_pixel": self.encode_s_per_pixel,
            "shot_overhead_s": self.shot_overhead_s,
            "threads_per_worker": self.threads_per_worker,
            "output_streams_per_worker": self.output_streams_per_worker,
            "output_streams_per_node": self.output_streams_per_node,
            "disk_s_per_pixel": self.disk_s_per_pixel,
            "cores_encode_s_per_pixel": self.cores_encode_s_per_pixel,
            "cores_write_s_per_pixel": self.cores_write_s_per_pixel,
            "encode_reference": self.encode_reference.to_json(),
            "send_s_per_pixel": self.send_s_per_pixel,
            "decode_on_host": self.decode_on_host,
            "links": {k: asdict(v) for k, v in self.links.items()},
            "protocol": self.protocol,
            "workers_per_node": self.workers_per_node,
            "worker_memory_bytes": self.worker_memory_bytes,
            "piece_bytes_per_pixel": self.piece_bytes_per_pixel,
            "samples": [s.to_json() for s in self.samples],
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, where: str = "cost model") -> CostModel:
        try:
            coefficients = {str(k): float(v) for k, v in raw["decode"]["coefficients"].items()}
            unknown = [k for k in coefficients if k not in FEATURES]
            if unknown:
                raise FarmError(f"{where}: unknown decode features {unknown}; known: {list(FEATURES)}")
            memory = raw.get("worker_memory_bytes")
            return cls(
                name=str(raw["name"]),
                decoder=str(raw["decoder"]),
                dtype=str(raw.get("dtype", "bfloat16")),
                machine=str(raw["machine"]),
                date=str(raw["date"]),
                decode=DecodeCost(coefficients),
                task_overhead_s=float(raw.get("task_overhead_s", 0.0)),
                blend_s_per_pixel=float(raw.get("blend_s_per_pixel", 0.0)),
                write_s_per_pixel=float(raw.get("write_s_per_pixel", 0.0)),
                encode_s_per_pixel=float(raw.get("encode_s_per_pixel", 0.0)),
                shot_overhead_s=float(raw.get("shot_overhead_s", 0.0)),
                threads_per_worker=int(raw.get("threads_per_worker", 1)),
                output_streams_per_worker=int(raw.get("output_streams_per_worker", 1)),
                output_streams_per_node=int(raw.get("output_streams_per_node", 1)),
                disk_s_per_pixel=float(raw.get("disk_s_per_pixel", 0.0)),
                cores_encode_s_per_pixel=float(raw.get("cores_encode_s_per_pixel", 0.0)),
                cores_write_s_per_pixel=float(raw.get("cores_write_s_per_pixel", 0.0)),
                encode_reference=EncodeReference.from_json(
                    raw.get("encode_reference", EncodeReference().to_json())
                ),
                send_s_per_pixel=float(raw.get("send_s_per_pixel", 0.0)),
                decode_on_host=bool(raw.get("decode_on_host", False)),
                links={str(k): Link(**v) for k, v in raw.get("links", {}).items()},
                protocol=str(raw.get("protocol", "tcp")),
                workers_per_node=int(raw.get("workers_per_node", 8)),
                worker_memory_bytes=int(memory) if memory is not None else None,
                piece_bytes_per_pixel=int(raw.get("piece_bytes_per_pixel", PIECE_BYTES_PER_PIXEL)),
                samples=tuple(Sample.from_json(s) for s in raw.get("samples", [])),
                notes=tuple(str(n) for n in raw.get("notes", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FarmError(f"{where} is not a valid cost model: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------------------------------
# Stored models
# --------------------------------------------------------------------------------------------------


def available() -> list[str]:
    """Names of the cost models stored in the package."""
    folder = resources.files("farm.planning") / "costmodels"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load(name: str) -> CostModel:
    """A stored cost model by name (``ltx2-h200``, ``ltx2-tiny-cpu``) or a path to a JSON file."""
    if name.endswith(".json"):
        from pathlib import Path

        from farm.safe_read import read_json

        try:
            record = read_json(Path(name), f"cost model file {name!r}")
        except FileNotFoundError:
            raise FarmError(f"cost model file {name!r} does not exist") from None
        return CostModel.from_json(record, where=name)
    resource = resources.files("farm.planning") / "costmodels" / f"{name}.json"
    if not resource.is_file():
        raise FarmError(f"unknown cost model {name!r}; stored models: {available()} (or give a .json path)")
    return CostModel.from_json(json.loads(resource.read_text()), where=f"cost model {name!r}")


def default_name(spec: Any) -> str:
    """The stored model for a decoder spec: measured on the CPU for the tiny configs (test and demo
    decoders, which CPU workers run), on the H200 otherwise.

    Chosen from the spec alone (not from the machine planning runs on), so the same job plans the same
    way wherever `farm plan` or `farm render` runs.
    """
    return "ltx2-tiny-cpu" if str(getattr(spec, "config_name", None) or "").endswith("-tiny") else "ltx2-h200"


def scaled_to(
    model: CostModel, config: str | None, measured: tuple[str, Sequence[int], float] | None
) -> CostModel:
    """`model` with its decode seconds scaled to the decoder config `config`, from one measured decode of
    it, ``(machine kind "h200" or "cpu", pixel frames/height/width, seconds)``, when that was measured on
    the model's kind of machine (else `model` as it is): a HunyuanVideo tile costs ~20 times an LTX-2 tile
    of the same pixels on an H200, and plans must weigh it so (`cost_model`)."""
    if config is None or measured is None or model.decoder == config:
        return model
    kind, pixels, seconds = measured
    if kind != ("cpu" if model.decode_on_host else "h200"):
        return model
    ratio = seconds / model.decode_seconds(pixels)
    decode = DecodeCost({k: v * ratio for k, v in model.decode.coefficients.items()})
    note = (f"decode seconds of {model.decoder} scaled by {ratio:.3g} to {config} "
            f"({seconds:.3g} s measured for {'x'.join(map(str, pixels))} pixels)")  # fmt: skip
    return model.with_(name=f"{model.name}, scaled to {config}", decoder=config, decode=decode,
                       notes=(*model.notes, note))  # fmt: skip


def cost_model(spec: DecoderSpec, name: str | None = None) -> CostModel:
    """The cost model to plan `spec`'s decodes with: the stored model `name` (default: `default_name`),
    its decode seconds scaled to the spec's config where the adapter records a decode of it on that kind
    of machine (``decode_seconds_measured``)."""
    model = load(name or default_name(spec))
    measured = decoder_class(spec).decode_seconds_measured.get(spec.config_name or "")
    return scaled_to(model, spec.config_name, measured)


def for_encoding(
    model: CostModel, codec: str, preset: str | None, bits_per_pixel: float | None = None
) -> CostModel:
    """`model` with its encode figures scaled to encodes with `codec` at `preset` of frames written at
    `bits_per_pixel` (None: the frames the model was measured on), by the stored encode rates
    (`farm.planning.encode_cost`)."""
    factor = encode_factor(model.encode_reference, codec, preset, bits_per_pixel)
    if factor == 1.0:
        return model
    return model.with_(encode_s_per_pixel=model.encode_s_per_pixel * factor,
                       cores_encode_s_per_pixel=model.cores_encode_s_per_pixel * factor)  # fmt: skip


def without_video(model: CostModel) -> CostModel:
    """`model` for a render that writes no video: no encodes."""
    return model.with_(encode_s_per_pixel=0.0, cores_encode_s_per_pixel=0.0)


def time_decodes(
    decode: Callable[[tuple[int, int, int]], tuple[int, int, int]],
    latent_shapes: Iterable[tuple[int, int, int]],
    *,
    reps: int = 3,
    clock: Callable[[], float] | None = None,
) -> list[Sample]:
    """Measure samples: `decode(latent_fhw)` decodes a latent of that shape and returns its pixel shape.

    One untimed warm-up call per shape, then the median of `reps` timed calls.
    """
    import time

    clock = clock or time.perf_counter
    out = []
    for fhw in latent_shapes:
        pixels = decode(fhw)
        times = []
        for _ in range(reps):
            t0 = clock()
            decode(fhw)
            times.append(clock() - t0)
        out.append(Sample((*pixels,), float(np.median(times)), (*fhw,), f"median of {reps}"))
    return out


def relative_rms(cost: DecodeCost, samples: Iterable[Sample]) -> float:
    errs = [e for _, _, e in fit_report(cost, samples)]
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0


__all__ = [
    "CostModel",
    "DecodeCost",
    "FEATURES",
    "Link",
    "Sample",
    "available",
    "cost_model",
    "default_name",
    "features",
    "for_encoding",
    "without_video",
    "scaled_to",
    "fit_decode_cost",
    "load",
    "nnls",
    "time_decodes",
]
