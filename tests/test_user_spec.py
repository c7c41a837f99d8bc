"""One reader for decoder specs as users give them, video and sound alike (`farm.decoders.user_spec`): a
named config, JSON text, a JSON file or a mapping, with the weights given beside it."""

from __future__ import annotations

import json

import pytest

from farm.decoders.ltx2.audio import AudioSpec
from farm.decoders.user_spec import resolve_sound_spec, resolve_spec
from farm.errors import FarmError
from farm.inputs.synthetic import synth_spec

SOUND = {"family": "ltx2-audio", "config": "ltx2-audio-tiny", "weights": {"random_seed": 3}}
VIDEO = {"family": "wan", "config": "wan-tiny", "weights": {"random_seed": 3}}


@pytest.mark.parametrize("form", ["name", "text", "file", "mapping"])
def test_a_sound_spec_reads_in_every_form_a_video_spec_does(form, tmp_path):
    given = {"name": "ltx2-audio-tiny", "text": json.dumps(SOUND), "mapping": SOUND}.get(form)
    if form == "file":
        (tmp_path / "sound.json").write_text(json.dumps(SOUND))
        given = str(tmp_path / "sound.json")
    spec = resolve_sound_spec(given, default_weights={"random_seed": 3})
    assert isinstance(spec, AudioSpec) and spec.to_json()["config"] == "ltx2-audio-tiny"
    assert spec.weights == {"random_seed": 3}


@pytest.mark.parametrize("form", ["name", "text", "file", "mapping"])
def test_a_video_spec_reads_in_every_form_for_synth_and_ingest_alike(form, tmp_path):
    given = {"name": "wan-tiny", "text": json.dumps(VIDEO), "mapping": VIDEO}.get(form)
    if form == "file":
        (tmp_path / "video.json").write_text(json.dumps(VIDEO))
        given = str(tmp_path / "video.json")
    for spec in (synth_spec(given, seed=3), resolve_spec(given, default_weights={"random_seed": 3})):
        assert (spec.family, spec.config_name, spec.weights) == ("wan", "wan-tiny", {"random_seed": 3})
        assert spec.dtype == "float32"  # a -tiny config


def test_weights_beside_the_spec_win_and_a_spec_without_any_is_refused_naming_the_option(tmp_path):
    weights = tmp_path / "vae.safetensors"
    weights.write_bytes(b"")
    assert resolve_spec("wan-tiny", weights=weights).weights == {"path": str(weights)}
    with pytest.raises(FarmError, match=r"--decoder 'wan' needs weights: --weights PATH .*random weights"):
        resolve_spec("wan")
    with pytest.raises(FarmError, match=r"--audio-decoder 'ltx2-audio' needs weights: --audio-weights PATH"):
        resolve_sound_spec("ltx2-audio")
    with pytest.raises(FarmError, match=r"--audio-decoder .*missing.json: no such file"):
        resolve_sound_spec(str(tmp_path / "missing.json"), default_weights={"random_seed": 0})


def test_the_default_dtype_follows_the_config_and_how_it_was_given():
    assert synth_spec("wan").dtype == "bfloat16"  # a released config by name
    assert synth_spec({"family": "wan", "config": "wan"}).dtype == "float32"  # synth: a spec object
    assert resolve_spec({**VIDEO, "config": "wan"}).dtype == "bfloat16"  # ingest: released precision
    assert resolve_spec(VIDEO, dtype="float16").dtype == "float16"
