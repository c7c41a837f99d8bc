"""Launch pacing (`farm.decoders.launch_pacing`): a decode queued at most a few convolutions ahead of the
GPU. The pacer's bookkeeping is checked with recording events on the CPU; on a GPU, that a paced decode
waits and gives the same frames as an unpaced one."""

from __future__ import annotations

import dask
import pytest
import torch

from farm.decoders import load_decoder
from farm.decoders.launch_pacing import LaunchPacer, launch_lead, pace_launches
from farm.errors import FarmError
from farm.inputs.synthetic import synth_spec


class RecordingEvent:
    log: list[tuple[str, int]] = []
    made = 0

    def __init__(self) -> None:
        RecordingEvent.made += 1
        self.n = RecordingEvent.made

    def record(self) -> None:
        self.log.append(("record", self.n))

    def synchronize(self) -> None:
        self.log.append(("wait", self.n))


@pytest.fixture
def events():
    RecordingEvent.log, RecordingEvent.made = [], 0
    return RecordingEvent


def test_pacer_waits_for_the_oldest_step_once_more_than_lead_are_queued(events):
    pacer = LaunchPacer(events, lead=3)
    for _ in range(3):
        pacer.step()
    assert [what for what, _ in events.log] == ["record"] * 3 and pacer.waits == 0
    for _ in range(7):
        pacer.step()
        assert len(pacer.pending) == 3  # never more than `lead` steps ahead
    waited = [n for what, n in events.log if what == "wait"]
    assert waited == [1, 2, 3, 4, 5, 6, 7] and pacer.waits == 7  # oldest first, each once
    # each wait comes right after the record of the step that went past the lead
    assert events.log[3:5] == [("record", 4), ("wait", 1)]


def test_a_lead_of_zero_marks_nothing_and_a_lead_set_later_paces(events):
    pacer = LaunchPacer(events, lead=0)
    for _ in range(5):
        pacer.step()
    assert events.log == [] and not pacer.pending
    pacer.lead = 1  # set on a running worker
    for _ in range(3):
        pacer.step()
    assert [n for what, n in events.log if what == "wait"] == [1, 2] and pacer.waits == 2
    pacer.lead = 0
    pacer.step()
    assert not pacer.pending and pacer.waits == 2


def test_a_negative_lead_is_refused(events):
    with pytest.raises(ValueError, match="≥ 0"):
        LaunchPacer(events, lead=-1)


def test_a_decoder_on_a_cpu_is_not_paced():
    module = torch.nn.Sequential(torch.nn.Conv3d(2, 2, 1), torch.nn.Conv2d(2, 2, 1))
    assert pace_launches(module) is None
    assert all(not m._forward_hooks for m in module.modules())
    with dask.config.set({"farm.launch-lead": 6}):
        assert load_decoder(synth_spec("ltx2-tiny", seed=11), "cpu").pacer is None


def test_hooked_convolutions_compile_without_a_graph_break(events):
    """`--compile` traces the decoder with the hooks in place: they must not break its graph."""
    import torch._dynamo

    conv = torch.nn.Conv3d
    module = torch.nn.Sequential(conv(2, 4, 3, padding=1), torch.nn.SiLU(), conv(4, 2, 1))
    pacer = pace_launches(module, 2, make_event=events)
    x = torch.randn(1, 2, 3, 4, 4)
    with torch.no_grad():
        eager = module(x)
        explained = torch._dynamo.explain(module)(x)
        compiled = torch.compile(module, backend="aot_eager")(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert torch.allclose(compiled, eager) and pacer.waits == 0 and events.log == []  # CPU outputs: no steps


@pytest.mark.parametrize(("value", "lead"), [(0, 0), (6, 6), ("8", 8)])
def test_launch_lead_reads_the_setting(value, lead):
    with dask.config.set({"farm.launch-lead": value}):
        assert launch_lead() == lead


@pytest.mark.parametrize("value", [-1, 2.5, "six", True])
def test_an_invalid_launch_lead_is_refused_before_any_cluster_starts(value):
    from farm.media.settings import VideoSettings
    from farm.planning.options import PlanOptions
    from farm.run.validate import check_render_options

    with dask.config.set({"farm.launch-lead": value}), pytest.raises(FarmError, match="farm.launch-lead"):
        check_render_options(options=PlanOptions(tiles=(1, 1, 1)), video=VideoSettings(enabled=False))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs on the device machine)")
@pytest.mark.parametrize("name", ["ltx2-tiny", "wan-tiny"])
def test_a_paced_decode_waits_and_gives_the_unpaced_frames(name):
    with dask.config.set({"farm.launch-lead": 6}):  # a seed of its own: not a decoder loaded unpaced
        decoder = load_decoder(synth_spec(name, seed=12, dtype="float32"), "cuda")
    assert decoder.pacer is not None
    c, g = decoder.latent_channels, decoder.geometry
    latent = torch.randn(c, 4, 8, 12, generator=torch.Generator().manual_seed(0))
    decoder.pacer.lead = 0
    unpaced = decoder.decode(latent, origin=(0, 0, 0))
    decoder.pacer.lead = 6
    before = decoder.pacer.waits
    paced = decoder.decode(latent, origin=(0, 0, 0))
    torch.cuda.synchronize()
    assert decoder.pacer.waits > before  # it held the thread back, more than `lead` convolutions in
    assert torch.equal(paced, unpaced) and paced.shape[1] == (4 - 1) * g.temporal_scale + 1
