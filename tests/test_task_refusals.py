"""fl2va/ref2va where they cannot run (issue 21): a remote tier (this studio sends SGLang servers text only) and
the sequence-parallel engine (`--ulysses`: only rank 0 holds the conditioner) refuse at request validation, naming
the input field, instead of dropping the images and rendering text-to-video; video and audio files given as
references are refused naming the field and what is missing (torchvision)."""

from __future__ import annotations

import pytest

from engine.errors import RequestError
from engine.request import ModelLimits
from engine.tiers import TierTable
from tests.test_tasks import image_bytes

IMAGE = image_bytes(5, 64, 64)


class _Pool:
    """What RemoteTier.plan asks of its pool before it sends anything."""

    def model_defaults(self, tier):
        return ModelLimits(), None

    def servers(self, tier):
        raise AssertionError("a refused request must not reach a server")


@pytest.mark.parametrize("payload,field", [
    ({"first_frame": IMAGE}, "first_frame"),
    ({"first_frame": IMAGE, "last_frame": IMAGE}, "first_frame"),
    ({"last_frame": IMAGE}, "last_frame"),
    ({"references": [IMAGE]}, "references"),
])
def test_a_remote_tier_refuses_keyframes_and_references_naming_the_field(payload, field):
    from studio.remote import RemoteTier

    with pytest.raises(RequestError) as refused:
        RemoteTier(_Pool(), "turbo").plan({"prompt": "a red circle", **payload})
    assert refused.value.field == field
    assert "remote servers" in refused.value.message and "local tier" in refused.value.message


@pytest.mark.parametrize("payload,field", [
    ({"first_frame": IMAGE}, "first_frame"),
    ({"references": [IMAGE, IMAGE]}, "references"),
])
def test_the_sequence_parallel_engine_refuses_keyframes_and_references_naming_the_field(payload, field):
    from engine.parallel import ParallelEngine

    engine = ParallelEngine.__new__(ParallelEngine)  # validation only: no worker group is started
    engine.tiers, engine.limits = TierTable.load(), ModelLimits()
    assert engine.validate({"prompt": "a red circle"}).task == "t2va"
    with pytest.raises(RequestError) as refused:
        engine.validate({"prompt": "a red circle", **payload})
    assert refused.value.field == field and "sequence-parallel engine runs text-to-video only" in refused.value.message


@pytest.mark.parametrize("magic", [b"\0\0\0\x20ftypisom" + b"\0" * 64, b"RIFF\0\0\0\0WAVEfmt " + b"\0" * 64,
                                   b"ID3\x04" + b"\0" * 64])
def test_video_and_audio_references_are_refused_naming_the_field_and_torchvision(magic):
    from engine.conditioning import validate_inputs

    with pytest.raises(RequestError) as refused:
        validate_inputs({"references": [IMAGE, magic]})
    assert refused.value.field == "references[1]"
    assert "video or audio file" in refused.value.message and "torchvision" in refused.value.message
