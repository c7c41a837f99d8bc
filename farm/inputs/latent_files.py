"""Latent tensors in the files other tools save: what each file holds, read without trusting it.

Formats (by extension, confirmed by the file's first bytes):

* ``.latent``: ComfyUI's Save Latent node: safetensors with ``latent_tensor`` ``[B, C, F, H, W]`` and the
  empty marker ``latent_format_version_0``; the metadata holds the workflow (``prompt``) as JSON. A file
  without the marker is ComfyUI's legacy format, which its Load Latent node multiplies by 1/0.18215;
  farm does the same.
* ``.safetensors``: a tensor named with ``tensor=``, else ``latent_tensor``/``latents``/``latent``/
  ``samples``, else the only tensor in the file.
* ``.pt``/``.pth``: ``torch.load(weights_only=True)``: a tensor, or a dict/list of tensors (chosen as for
  safetensors). Any other pickled object is refused by torch's restricted unpickler before it runs.
* ``.npy`` (``allow_pickle=False``) and ``.npz`` (arrays chosen as for safetensors).

:func:`detect_format` and :func:`comfyui_info` are pure; :func:`scan` reads headers (shapes, dtypes,
metadata) and :func:`load` reads the data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from farm.decoders import FAMILIES
from farm.decoders.checkpoints import check_torch_storages
from farm.errors import FarmError
from farm.safe_read import parse_json

FORMATS = {
    ".latent": "comfyui",
    ".safetensors": "safetensors",
    ".pt": "torch",
    ".pth": "torch",
    ".npy": "numpy",
    ".npz": "numpy-zip",
}
PREFERRED_KEYS = ("latent_tensor", "latents", "latent", "samples")
COMFYUI_LEGACY_SCALE = 1.0 / 0.18215  # ComfyUI's LoadLatent, for files without latent_format_version_0

# Which farm decoder families a ComfyUI workflow points to (a hint, checked against --decoder): words in
# its node types and in the model files its loaders name. "Empty…Latent…" nodes are left out: ComfyUI's
# Wan examples start from EmptyHunyuanLatentVideo.
# Each adapter declares its words (`comfyui_words`); a word may point to several families.
COMFYUI_FAMILY_WORDS: dict[str, tuple[str, ...]] = {
    word: tuple(f for f, c in FAMILIES.items() if word in c.comfyui_words)
    for word in sorted({w for c in FAMILIES.values() for w in c.comfyui_words})
}
COMFYUI_MODEL_INPUTS = ("vae_name", "unet_name", "ckpt_name", "model_name")


def _channel_families() -> dict[int, tuple[str, ...]]:
    """Latent channels of the released models (every named config but the tiny ones) → their families."""
    out: dict[int, list[str]] = {}
    for family, cls in FAMILIES.items():
        for name, config in cls.named_configs.items():
            channels = cls.latent_channels_for(config)
            if not name.endswith("-tiny") and family not in out.setdefault(channels, []):
                out[channels].append(family)
    return {c: tuple(f) for c, f in out.items()}


# Latent channels of the published models → the families that have them (a hint in refusals).
CHANNEL_FAMILIES = _channel_families()


def supported() -> str:
    return ", ".join(sorted(FORMATS))


def detect_format(name: str, head: bytes) -> str:
    """A file's format from its name and first bytes (at least 16); FarmError if unknown or mislabelled."""
    suffix = Path(name).suffix.lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        raise FarmError(
            f"{name}: unknown latent file format {suffix or '(no extension)'!r}; farm reads {supported()}"
        )
    looks = _sniff(head)
    expected = {"comfyui": "safetensors", "safetensors": "safetensors", "torch": "zip", "numpy": "npy",
                "numpy-zip": "zip"}[fmt]  # fmt: skip
    if looks != expected:
        raise FarmError(
            f"{name}: the extension says {fmt} but the file does not start like one "
            f"({'looks like ' + looks if looks else 'unrecognised bytes'}); is it truncated or misnamed?"
        )
    return fmt


def _sniff(head: bytes) -> str | None:
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PK\x03\x04"):
        return "zip"  # torch.save's default and .npz
    if len(head) >= 9:
        n = int.from_bytes(head[:8], "little")
        if 0 < n < 100_000_000 and head[8:9] == b"{":
            return "safetensors"
    return None


@dataclass(frozen=True)
class ComfyInfo:
    """What a ComfyUI .latent file says about itself."""

    format_version: int | None  # 0 with the latent_format_version_0 marker, None for the legacy format
    families: tuple[str, ...]  # farm decoder families its workflow's nodes point to (empty: no hint)
    fps: float | None  # the workflow's frame rate, where its nodes name exactly one


def comfyui_info(tensor_names: set[str], metadata: Mapping[str, str]) -> ComfyInfo:
    """Format version, model family hint and frame rate from a .latent file's tensors and metadata."""
    version = 0 if "latent_format_version_0" in tensor_names else None
    families: set[str] = set()
    rates: set[float] = set()
    try:
        prompt = parse_json(metadata.get("prompt") or "{}", "the ComfyUI prompt in its metadata")
    except FarmError:
        prompt = {}
    nodes = prompt.values() if isinstance(prompt, dict) else []
    for node in nodes:
        if not isinstance(node, dict):
            continue
        kind = str(node.get("class_type", ""))
        raw_inputs = node.get("inputs")
        inputs = raw_inputs if isinstance(raw_inputs, dict) else {}
        texts = [] if kind.startswith("Empty") else [kind.lower()]
        texts += [str(inputs[k]).lower() for k in COMFYUI_MODEL_INPUTS if k in inputs]
        for word, fams in COMFYUI_FAMILY_WORDS.items():
            if any(word in t for t in texts):
                families.update(fams)
        for key in ("frame_rate", "fps"):
            value = inputs.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                rates.add(float(value))
    return ComfyInfo(version, tuple(sorted(families)), rates.pop() if len(rates) == 1 else None)


@dataclass(frozen=True)
class FoundTensor:
    """One latent tensor in one file, before its data is read."""

    path: Path
    format: str
    key: str | None  # its name inside the file (None: the file is one tensor)
    shape: tuple[int, ...]
    dtype: str
    comfyui: ComfyInfo | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # safetensors metadata (strings), or a record
    label: str | None = None  # the name to use instead of the file's stem (latents not from a file)

    @property
    def stem(self) -> str:
        return self.label if self.label is not None else self.path.stem


def pick_key(keys: list[str], wanted: str | None, where: str) -> str:
    """The tensor to ingest among a file's `keys`: `wanted`, a conventional name, or the only one."""
    if wanted is not None:
        if wanted not in keys:
            raise FarmError(f"{where}: no tensor named {wanted!r}; it holds {sorted(keys)}")
        return wanted
    for name in PREFERRED_KEYS:
        if name in keys:
            return name
    tensors = [k for k in keys if k != "latent_format_version_0"]
    if len(tensors) == 1:
        return tensors[0]
    if not tensors:
        raise FarmError(f"{where}: holds no tensors")
    raise FarmError(
        f"{where}: holds several tensors {sorted(tensors)} and none is named {' or '.join(PREFERRED_KEYS)}; "
        "choose one with --tensor NAME"
    )


def read_head(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(16)
    except OSError as exc:
        raise FarmError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def scan(path: Path, tensor: str | None = None) -> FoundTensor:
    """Open one file and describe the latent tensor it holds (shape, dtype, metadata), data unread."""
    fmt = detect_format(path.name, read_head(path))
    try:
        if fmt in ("comfyui", "safetensors"):
            return _scan_safetensors(path, fmt, tensor)
        if fmt == "torch":
            obj = _torch_load(path)
            key, value = _choose(obj, tensor, str(path))
            return FoundTensor(path, fmt, key, tuple(value.shape), str(value.dtype).removeprefix("torch."))
        if fmt == "numpy":
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
            return FoundTensor(path, fmt, None, tuple(arr.shape), str(arr.dtype))
        with np.load(path, allow_pickle=False) as npz:
            key = pick_key(list(npz.files), tensor, str(path))
        shape, dtype = npz_member_header(path, key)
        return FoundTensor(path, fmt, key, shape, str(dtype))
    except FarmError:
        raise
    except Exception as exc:  # each library raises its own types for corrupt files
        raise FarmError(f"{path}: cannot read it as {fmt} ({type(exc).__name__}: {exc})") from None


def _scan_safetensors(path: Path, fmt: str, tensor: str | None) -> FoundTensor:
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as fh:
        keys = list(fh.keys())
        metadata = dict(fh.metadata() or {})
        if fmt == "comfyui":
            if "latent_tensor" not in keys:
                raise FarmError(f"{path}: a .latent file must hold 'latent_tensor' (ComfyUI's Save Latent); "
                                f"it holds {sorted(keys)}")  # fmt: skip
            key = "latent_tensor"
        else:
            key = pick_key(keys, tensor, str(path))
        sl = fh.get_slice(key)
        shape, dtype = tuple(sl.get_shape()), str(sl.get_dtype()).lower()
    info = comfyui_info(set(keys), metadata) if fmt == "comfyui" else None
    return FoundTensor(path, fmt, key, shape, _safetensors_dtype(dtype), info, metadata)


def _safetensors_dtype(name: str) -> str:
    return {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}.get(name, name)


def _torch_load(path: Path) -> Any:
    import pickle

    import torch


    check_torch_storages(path)  # a short member, or a storage far larger than its tensors: refused unread
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FarmError(
            f"{path}: refused: it holds pickled objects other than tensors ({first}). farm loads .pt/.pth "
            "files with torch.load(weights_only=True) and never runs code from a file; save the latent "
            "tensor itself (torch.save(tensor, path)) or use .safetensors"
        ) from None


def _choose(obj: Any, tensor: str | None, where: str) -> tuple[str | None, Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        if tensor is not None:
            raise FarmError(f"{where}: holds one unnamed tensor; drop --tensor {tensor}")
        return None, obj
    if isinstance(obj, list | tuple):
        obj = {str(i): v for i, v in enumerate(obj)}
    if isinstance(obj, dict):
        tensors = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        key = pick_key(list(tensors), tensor, where)
        return key, tensors[key]
    raise FarmError(f"{where}: holds a {type(obj).__name__}, not a tensor or a dict of tensors")


NPY_HEADER_MAX = 1 << 16  # a .npy header past 64 KiB is not one numpy writes


def npz_member_header(path: Path, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one array of a ``.npz``, read from its ``.npy`` header alone (nothing else is
    decompressed), after checking that the member's unpacked size is what the header declares: a
    small compressed file may not unpack into more than its array (a zip bomb)."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{key}.npy")
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            header = min(member.tell(), NPY_HEADER_MAX)  # bytes before the array's data
    declared = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if dtype.hasobject or info.file_size > declared + header:
        raise FarmError(
            f"{path}: array {key!r} unpacks to {info.file_size} bytes but declares {tuple(shape)} "
            f"{dtype} ({declared} bytes); the file is damaged or not what it says"
        )
    return tuple(int(n) for n in shape), dtype


def load(found: FoundTensor) -> np.ndarray:
    """The tensor's data as a float numpy array (bfloat16 and float64 become float32; float16 stays)."""
    path = found.path
    try:
        if found.format in ("comfyui", "safetensors"):
            data = _load_safetensors(found)
        elif found.format == "torch":
            data = torch_to_numpy(_choose(_torch_load(path), found.key, str(path))[1])
        elif found.format == "numpy":
            data = np.load(path, allow_pickle=False)
        else:
            npz_member_header(path, str(found.key))  # refuses a member larger than its array
            with np.load(path, allow_pickle=False) as npz:
                data = npz[found.key]
    except FarmError:
        raise
    except Exception as exc:
        raise FarmError(f"{path}: cannot read its data ({type(exc).__name__}: {exc})") from None
    if found.comfyui is not None and found.comfyui.format_version is None:
        data = data.astype(np.float32) * np.float32(COMFYUI_LEGACY_SCALE)
    return float_latent(data, str(path))


def _load_safetensors(found: FoundTensor) -> np.ndarray:
    from safetensors import safe_open

    if found.dtype == "bfloat16":  # numpy has no bfloat16: read through torch
        with safe_open(str(found.path), framework="pt") as fh:
            return torch_to_numpy(fh.get_tensor(found.key))
    with safe_open(str(found.path), framework="np") as fh:
        return fh.get_tensor(found.key)


def torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.detach().cpu().contiguous().numpy()


def float_latent(data: np.ndarray, where: str) -> np.ndarray:
    if not np.issubdtype(data.dtype, np.floating):
        raise FarmError(
            f"{where}: latent dtype {data.dtype} is not floating point; latents are float tensors"
        )
    return np.ascontiguousarray(data if data.dtype in (np.float16, np.float32) else data.astype(np.float32))


def expand_sources(
    sources: list[str | os.PathLike], on_skip: Callable[[Path], None] | None = None
) -> list[Path]:
    """Files named, found in folders (not recursive) or matched by globs, sorted, without repeats.

    Files in folders and glob matches whose extension farm does not read are skipped (`on_skip`); a file
    named explicitly must be one farm reads."""
    import glob

    out: list[Path] = []
    for source in sources:
        text = str(source)
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            out.append(path)
            continue
        elif glob.has_magic(text):
            found = sorted(Path(p) for p in glob.glob(text) if Path(p).is_file())
            if not found:
                raise FarmError(f"{text}: the pattern matches no files")
        else:
            raise FarmError(f"{text}: no such file or folder")
        kept = [p for p in found if p.suffix.lower() in FORMATS]
        for p in found:
            if p.suffix.lower() not in FORMATS and on_skip:
                on_skip(p)
        if not kept:
            raise FarmError(f"{text}: holds no latent files ({supported()})")
        out.extend(kept)
    seen: set[Path] = set()
    unique = []
    for p in out:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique
