"""SGLang 0.5.23's own /v1/videos models, the oracle of the studio's video API (issue 38).

`VideoGenerationsRequest` (what an SGLang server accepts), `VideoResponse` and `VideoListResponse` (what it answers)
come from the installed `sglang` package's multimodal_gen/runtime/entrypoints/openai/protocol.py. That file needs
only pydantic, but importing it through the package runs sglang/__init__ and multimodal_gen's, which pull the GPU
serving runtime; so the file is loaded on its own from where pip put it (scripts/install.sh installs the wheel with
--no-deps). `importlib.util.find_spec` locates the package without importing it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from pathlib import Path
from types import ModuleType

SGLANG_VERSION = "0.5.23"
PROTOCOL = Path("multimodal_gen/runtime/entrypoints/openai/protocol.py")


@functools.cache
def protocol() -> ModuleType:
    installed = importlib.metadata.version("sglang")
    assert installed == SGLANG_VERSION, f"sglang {installed} installed; the oracle is {SGLANG_VERSION}"
    package = importlib.util.find_spec("sglang")
    path = Path(package.submodule_search_locations[0]) / PROTOCOL
    spec = importlib.util.spec_from_file_location("sglang_video_protocol", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def valid_request(body: dict) -> object:
    """The body as an SGLang server parses it (pydantic's ValidationError if it would refuse it)."""
    return protocol().VideoGenerationsRequest.model_validate(body)


def valid_video(body: dict) -> object:
    """A /v1/videos/{id} (or create, remix, delete) response as SGLang's VideoResponse."""
    return protocol().VideoResponse.model_validate(body)


def valid_list(body: dict) -> object:
    return protocol().VideoListResponse.model_validate(body)


def valid_form(fields: dict[str, str], files: list[tuple[str, tuple]]) -> object:
    """A multipart/form-data body as an SGLang server reads it (video_api.py's create_video): the text fields it
    declares (VideoGenerationsRequest's own; others, such as H3's task and target, stay with a server whose model
    declares them), and the uploaded ``input_reference`` image saved to a file whose path becomes the request's
    ``input_reference``. pydantic's ValidationError if it would refuse the body."""
    declared = protocol().VideoGenerationsRequest.model_fields
    assert all(isinstance(value, str) for value in fields.values()), "multipart text fields are strings"
    body = {name: value for name, value in fields.items() if name in declared}
    uploads = [name for name, _ in files if name == "input_reference"]
    assert len(uploads) <= 1, "SGLang takes one input_reference file"
    if uploads:
        body["input_reference"] = "/tmp/sglang_uploads/input_reference.png"
    return valid_request(body)
