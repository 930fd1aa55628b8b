"""fl2va/ref2va where they cannot run (issues 21, 38): a remote tier whose servers would not take the images (a stock
SGLang server takes one input_reference, the first frame) and the sequence-parallel engine (`--ulysses`: only rank 0
holds the conditioner) refuse at request validation, naming the input field, instead of dropping the images and
rendering text-to-video; video and audio files given as references are refused naming the field and what is missing
(torchvision)."""

from __future__ import annotations

import pytest

from engine.errors import RequestError
from engine.request import ModelLimits, validate_request
from engine.tiers import TierTable
from studio.remote_body import ServerInputs, check_inputs
from tests.test_tasks import image_bytes

IMAGE = image_bytes(5, 64, 64)


class _Pool:
    """What RemoteTier.plan asks of its pool before it sends anything: the servers' word on what they take."""

    def __init__(self, *inputs):
        self.inputs = list(inputs)

    def model_defaults(self, tier):
        return ModelLimits(), None

    def server_inputs(self, tier):
        return self.inputs

    def servers(self, tier):
        raise AssertionError("a refused request must not reach a server")


SGLANG = ServerInputs("sglang-a")  # a stock SGLang server lists no tasks: SGLang's one input_reference image
STUDIO = ServerInputs("studio-a", ("t2va", "fl2va", "ref2va"), 9)  # this studio's /models lists them


@pytest.mark.parametrize("servers,payload,field,says", [
    ((SGLANG,), {"first_frame": IMAGE, "last_frame": IMAGE}, "last_frame", "one image, input_reference"),
    ((SGLANG,), {"last_frame": IMAGE}, "last_frame", "send a first frame only"),
    ((SGLANG,), {"references": [IMAGE]}, "references", "lists no tasks: it takes t2va, fl2va, not ref2va"),
    ((STUDIO, ServerInputs("studio-b", ("t2va", "fl2va", "ref2va"), 2)), {"references": [IMAGE] * 3}, "references",
     "holds 3 images; tier turbo runs on remote 'studio-b', which takes at most 2"),
    ((ServerInputs("t2va-only", ("t2va",), 0),), {"first_frame": IMAGE}, "first_frame",
     "says it takes t2va, not fl2va"),
])
def test_a_remote_tier_refuses_images_its_servers_would_not_take_naming_the_field(servers, payload, field, says):
    """Issue 38: a remote tier sends keyframes and references (multipart) to servers that take them, and refuses
    at submission, naming the field, the images a server of the tier would drop."""
    from studio.remote import RemoteTier

    with pytest.raises(RequestError) as refused:
        RemoteTier(_Pool(*servers), "turbo").plan({"prompt": "a red circle", **payload})
    assert refused.value.field == field and says in refused.value.message, refused.value.message


@pytest.mark.parametrize("servers,payload", [
    ((SGLANG,), {"first_frame": IMAGE}),  # SGLang's own input_reference
    ((STUDIO,), {"first_frame": IMAGE, "last_frame": IMAGE}),
    ((STUDIO,), {"references": [IMAGE] * 9}),
])
def test_what_a_remote_takes_passes(servers, payload):
    request = validate_request({"prompt": "a red circle", **payload})
    check_inputs(request, "turbo", list(servers))


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
