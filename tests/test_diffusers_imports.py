"""farm.decoders.diffusers_imports: one model class imported without every model of diffusers, and the
deferred packages whole again as soon as anything asks them for more. Each case runs in a fresh
interpreter (what a new decode worker is)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def run_fresh(code: str) -> dict:
    """Run `code` in a new interpreter; it prints one JSON object, returned here."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_one_class_loads_only_its_own_model_files():
    found = run_fresh("""
        import json, sys
        from farm.decoders.diffusers_imports import is_deferred, model_class

        cls = model_class("AutoencoderKLLTX2Video")
        models = [m for m in sys.modules if m.startswith("diffusers.models.")]
        print(json.dumps({
            "class": f"{cls.__module__}.{cls.__name__}",
            "deferred": [is_deferred(p) for p in ("diffusers.models.autoencoders", "diffusers.models.unets",
                                                  "diffusers.models.transformers")],
            "wan": "diffusers.models.autoencoders.autoencoder_kl_wan" in sys.modules,
            "flux": "diffusers.models.transformers.transformer_flux" in sys.modules,
            "models": len(models),
        }))
    """)
    assert found["class"] == "diffusers.models.autoencoders.autoencoder_kl_ltx2.AutoencoderKLLTX2Video"
    assert found["deferred"] == [True, True, True]
    assert not found["wan"] and not found["flux"]  # siblings and other kinds of model not imported


def test_deferred_packages_complete_on_first_need_and_match_the_usual_import():
    found = run_fresh("""
        import json
        import diffusers
        from farm.decoders.diffusers_imports import is_deferred, model_class

        ltx2 = model_class("AutoencoderKLLTX2Video")
        from diffusers.models.autoencoders import AutoencoderKLWan  # a name the package had not loaded
        import diffusers.models.unets as unets
        print(json.dumps({
            "same": diffusers.AutoencoderKLLTX2Video is ltx2,
            "wan": AutoencoderKLWan is diffusers.AutoencoderKLWan,
            "autoencoders": is_deferred("diffusers.models.autoencoders"),
            "unet": unets.UNet2DModel.__name__,
            "unets": is_deferred("diffusers.models.unets"),
            "pipeline": diffusers.LTX2Pipeline.__name__,
            "missing": hasattr(diffusers.models.autoencoders, "NoSuchModel"),
        }))
    """)
    assert found == {"same": True, "wan": True, "autoencoders": False, "unet": "UNet2DModel", "unets": False,
                     "pipeline": "LTX2Pipeline", "missing": False}  # fmt: skip


def test_a_package_already_imported_is_left_as_it_is():
    found = run_fresh("""
        import json
        import diffusers.models.autoencoders
        from farm.decoders.diffusers_imports import is_deferred, model_class

        model_class("AutoencoderKLWan")
        print(json.dumps({"deferred": is_deferred("diffusers.models.autoencoders")}))
    """)
    assert found == {"deferred": False}
