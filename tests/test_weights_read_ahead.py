"""A decoder built from a weights folder reads its tensors on a thread while its model is built on the meta
device (`farm.decoders.weights.reading_ahead`): for a named config, whose tensors are recorded, the read
runs beside the build (and the import of diffusers' model code it starts); without a recording the read
follows the build. Either way the decoder holds the same tensors. Real weights folders, real diffusers
models at tiny configs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from farm.decoders import spec_from_json
from farm.decoders.diffusers_vae import build_steps
from farm.decoders.ltx2 import LTX2_TINY, LTX2Decoder
from farm.decoders.weights import ReadAhead, check_weights, reading_ahead, recorded_tensors
from farm.errors import FarmError


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    from diffusers import AutoencoderKLLTX2Video

    folder = tmp_path_factory.mktemp("read-ahead") / "vae"
    torch.manual_seed(11)
    AutoencoderKLLTX2Video(**LTX2_TINY).save_pretrained(folder)
    return folder


def spec_for(weights: Path, config: object = "ltx2-tiny"):
    spec = spec_from_json({"family": "ltx2", "config": config, "weights": {"path": str(weights)}})
    return check_weights(spec, LTX2Decoder)


@pytest.fixture
def timeline(monkeypatch) -> list[tuple[str, str, float]]:
    """(step, thread, time) as the build of a decoder reads its weights and builds its model: both real,
    each noted as it starts and ends."""
    from farm.decoders import weights as W

    events: list[tuple[str, str, float]] = []
    read, build = W.read_planned, LTX2Decoder.meta_model.__func__

    def note(step: str) -> None:
        events.append((step, threading.current_thread().name, time.perf_counter()))

    def noted_read(*args, **kwargs):
        note("read starts")
        try:
            return read(*args, **kwargs)
        finally:
            note("read ends")

    def noted_build(cls, config):
        note("model starts")
        time.sleep(0.2)  # as an import of diffusers' model code would take
        try:
            return build(cls, config)
        finally:
            note("model ends")

    monkeypatch.setattr(W, "read_planned", noted_read)
    monkeypatch.setattr(LTX2Decoder, "meta_model", classmethod(noted_build))
    return events


def state_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_named_configs_weights_are_read_while_its_model_is_built(weights, timeline):
    ahead = LTX2Decoder.build_from_weights(spec_for(weights), "cpu")
    at = {step: (thread, when) for step, thread, when in timeline}
    assert at["read starts"][0] == "farm-weights-read" and at["model starts"][0] != "farm-weights-read"
    assert at["read starts"][1] < at["model ends"][1]  # beside the build, not after it
    steps = build_steps()
    assert set(steps) == {"decoder model", "weights read ahead"}, steps

    timeline.clear()  # a config given as an object has no recording: read after the build
    custom = LTX2Decoder.build_from_weights(spec_for(weights, dict(LTX2_TINY)), "cpu")
    at = {step: (thread, when) for step, thread, when in timeline}
    assert at["read starts"][1] > at["model ends"][1] and at["read starts"][0] != "farm-weights-read"
    assert set(build_steps()) == {"decoder model", "weights read"}

    a, b = state_of(ahead), state_of(custom)
    assert a.keys() == b.keys() and len(a) > 20
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(v.device.type == "cpu" and v.dtype == torch.float32 for v in a.values())


def test_the_tensors_read_ahead_are_the_models_recorded_ones(weights):
    spec = spec_for(weights)
    model = LTX2Decoder.meta_model(spec.config)
    assert recorded_tensors(spec, LTX2Decoder) == {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_a_read_not_taken_is_dropped_and_errors_are_raised_in_the_building_thread(weights):
    spec = spec_for(weights)
    recorded = recorded_tensors(spec, LTX2Decoder)
    with reading_ahead(spec, LTX2Decoder, recorded, "cpu", torch.float32) as ahead:
        assert isinstance(ahead, ReadAhead)
    assert ahead._state is None and ahead.seconds is not None  # finished, and nothing kept

    wrong = {**recorded, "decoder.conv_in.conv.weight": (1, 2, 3)}  # refused before any read starts
    refused = pytest.raises(FarmError, match="other shapes")
    with refused, reading_ahead(spec, LTX2Decoder, wrong, "cpu", torch.float32):
        pass

    failing = ReadAhead(lambda: {}["no such tensor"])  # a read's own error is raised where it is taken
    with pytest.raises(KeyError, match="no such tensor"):
        failing.take()

    with reading_ahead(spec, LTX2Decoder, None, "cpu", torch.float32) as nothing:
        assert nothing is None
