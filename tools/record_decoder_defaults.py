"""Record the constructor defaults of every diffusers class farm's adapters build, and each named
config's decoder parameter count, for the installed diffusers, in
`farm/decoders/constructor_defaults.json`; and each named config's decoder tensors (names and shapes,
built on the meta device) in `farm/decoders/decoder_tensors.json`, which the weight check compares
checkpoint headers against without importing torch or diffusers.

Planning (tile geometry, latent channels, memory) needs a config completed with these defaults and the
weights' size; reading
them from the recording spares the client importing diffusers (seconds) for `farm plan`, `farm render`'s
set-up and `farm ingest`. Rerun after changing the diffusers pin; `tests/test_decoders.py` checks the
recording against the installed classes.

    python tools/record_decoder_defaults.py
"""

from __future__ import annotations

from farm.decoders import FAMILIES
from farm.decoders.diffusers_vae import DEFAULTS_FILE, live_constructor_defaults
from farm.decoders.weights import TENSORS_FILE


def main() -> None:
    import importlib.metadata
    import json

    # the diffusers family names its class per spec: it has none to record
    classes = sorted({cls.model_class_name for cls in FAMILIES.values() if cls.model_class_name})
    record = {
        "diffusers": importlib.metadata.version("diffusers"),
        "classes": {name: live_constructor_defaults(name) for name in classes},
        "decoder_parameters": {
            f"{family}:{name}": cls.count_decoder_parameters(config)
            for family, cls in sorted(FAMILIES.items())
            for name, config in sorted(cls.named_configs.items())
        },
    }
    DEFAULTS_FILE.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tensors = {
        f"{family}:{name}": {k: list(v) for k, v in cls.decoder_tensor_shapes(config).items()}
        for family, cls in sorted(FAMILIES.items())
        for name, config in sorted(cls.named_configs.items())
    }
    text = json.dumps({"diffusers": record["diffusers"], "tensors": tensors}, sort_keys=True)
    TENSORS_FILE.write_text(text.replace('], "', '],\n"').replace("}, ", "},\n") + "\n")
    print(f"wrote {DEFAULTS_FILE} for diffusers {record['diffusers']}: {', '.join(classes)}")


if __name__ == "__main__":
    main()
