"""The error types every package above the engine understands.

A `RequestError` is something the user caused and can fix: it names the field and says what is allowed. The CLI
prints it as `error: …` with exit code 2, REST answers 4xx, the UI shows it next to the input. A `ModelLoadError`
means the checkpoint on disk is missing or broken; it lists every problem found, not just the first.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class RequestError(ValueError):
    """A bad request. `field` names the offending input; `message` says what is allowed."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def to_dict(self) -> dict:
        return {"field": self.field, "message": self.message}

    def renamed(self, renames: dict[str, str]) -> RequestError:
        """This error under the field name the caller used (`renames`: engine field -> the caller's)."""
        return RequestError(renames[self.field], self.message) if self.field in renames else self


@contextmanager
def fields_renamed(renames: dict[str, str]) -> Iterator[None]:
    """Inside it, a RequestError is re-raised under the field name the caller used (RequestError.renamed)."""
    try:
        yield
    except RequestError as error:
        renamed = error.renamed(renames)
        if renamed is not error:
            raise renamed from None
        raise


class ModelLoadError(RuntimeError):
    """A checkpoint folder that cannot be loaded. `problems` holds one line per missing or broken part."""

    def __init__(self, path: str, problems: list[str]):
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"cannot load MiniMax-H3 checkpoint at {path}:\n{lines}")
        self.path = path
        self.problems = problems


class GenerationCancelled(RuntimeError):
    """Raised inside the denoising loop when the caller's cancel flag is set."""



class InsufficientMemory(RequestError):
    """A valid request this machine cannot hold (engine/memory.py): refused before it starts, naming the field to
    change, the shortfall and the longest duration that fits. As a RequestError it is the CLI's `error: …` (exit
    2), REST's 400 naming the field and the UI's message beside it; the server keeps serving."""

    def __init__(self, field: str, message: str, short_bytes: int):
        super().__init__(field, message)
        self.short_bytes = short_bytes

    def to_dict(self) -> dict:
        return {**super().to_dict(), "short_bytes": self.short_bytes}
