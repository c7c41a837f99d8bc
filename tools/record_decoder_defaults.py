"""Record, for the installed diffusers, each family's `recorded.json` in its folder
(`farm/decoders/<family>/recorded.json`, read by `farm.decoders.recording`): the constructor defaults of
the diffusers class its adapter builds, and each named config's decoder parameter count and decoder
tensors (names and shapes, built on the meta device), which the weight check compares checkpoint
headers against without importing torch or diffusers.

Planning (tile geometry, latent channels, memory) needs a config completed with these defaults and the
weights' size; reading them from the recording spares the client importing diffusers (seconds) for
`farm plan`, `farm render`'s set-up and `farm ingest`. Rerun after changing the diffusers pin or adding a
named config; `tests/test_decoders.py` and `tests/test_checkpoints.py` check the recordings against the
installed classes.

    python tools/record_decoder_defaults.py
"""

from __future__ import annotations

from typing import Any

from farm.decoders import FAMILIES
from farm.decoders.diffusers_vae import live_constructor_defaults
from farm.decoders.recording import recording_path, recording_text


def family_record(cls: Any, diffusers: str) -> dict[str, Any]:
    """What a family records: its class's defaults (none for the diffusers family, whose specs name
    their class), and each named config's decoder parameters and tensors."""
    configs = sorted(cls.named_configs.items())
    record: dict[str, Any] = {
        "diffusers": diffusers,
        "decoder_parameters": {name: cls.count_decoder_parameters(config) for name, config in configs},
        "decoder_tensors": {
            name: {k: list(v) for k, v in cls.decoder_tensor_shapes(config).items()}
            for name, config in configs
        },
    }
    if cls.model_class_name:
        record["constructor_defaults"] = live_constructor_defaults(cls.model_class_name)
    return record


def main() -> None:
    import importlib.metadata

    diffusers = importlib.metadata.version("diffusers")
    for family, cls in sorted(FAMILIES.items()):
        record = family_record(cls, diffusers)
        if not cls.model_class_name and not cls.named_configs:
            continue  # nothing of its own to record
        path = recording_path(cls)
        path.write_text(recording_text(record))
        print(f"wrote {path} ({family}) for diffusers {diffusers}")


if __name__ == "__main__":
    main()
