"""The request bodies of the /v1 routes: every body is strict, JSON types are taken as sent (no true → 1, "yes" →
true or "5" → 5; an int is still a valid float), so a client never believes a value it sent meant what the server
guessed. Text fields refuse a lone surrogate."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_EXPORT_PAIRS = 1000  # one zip; each id is looked up, so an unbounded list is an unbounded request


def _unicode_text(value: str) -> str:
    """Refuse a lone surrogate (JSON "\\ud800" without its pair): it is not Unicode text, so it can be neither
    stored nor sent back as UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text: it holds a lone surrogate (\\ud800-\\udfff without its "
                         "pair)") from None
    return value


Text = Annotated[str, AfterValidator(_unicode_text)]
# Every body is strict: JSON types are taken as sent, no true → 1, "yes" → true or "5" → 5 (an int is still a
# valid float), so a client never believes a value it sent meant what the server guessed.


class Target(BaseModel):
    """The clip's canvas and length."""

    model_config = ConfigDict(extra="allow", strict=True)
    short_edge: int | None = Field(None, examples=[768])
    aspect_ratio: Text | None = Field(None, examples=["16:9"])
    duration_seconds: float | None = Field(None, examples=[5])


class VideoCreate(BaseModel):
    """A /v1/videos body as OpenAI's client and SGLang 0.5.23 send it, with H3's ``task``/``target`` and this studio's
    ``tier`` and ``force`` (studio/video_request.py maps it to the engine's request)."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt: Text
    model: Text | None = Field(None, description="accepted for OpenAI-client compatibility; one model is served")
    seconds: Text | int | float | None = Field(None, examples=["5"],
                                               description='clip length, "5" or 5; the response states the real '
                                                           'length (24 fps, 17n+5 frames: "5.166667")')
    size: Text | None = Field(None, examples=["224x128"], description='"WIDTHxHEIGHT": a canvas the model makes')
    width: int | None = Field(None, description="with height: another way to send size")
    height: int | None = None
    num_frames: int | None = Field(None, description="a frame count the model makes (17n+5 at 24 fps)")
    fps: int | None = Field(None, description="24, the model's rate, when sent")
    n: int | None = Field(None, description="1: one clip per request")
    seed: int | None = None
    num_inference_steps: int | None = Field(None, description="N sigma points = N - 1 transformer forwards (2..101)")
    task: Text = "t2va"
    target: Target | None = Field(None, description="MiniMax-H3's SGLang extension: the canvas and length")
    tier: Text | None = Field(None, description="acceleration tier (GET /v1/tiers); default baseline")
    force: bool | None = Field(None, description="generate a tier refused for ghosting risk anyway")


class VideoRemix(BaseModel):
    """OpenAI's remix: the source video's settings and seed with a new prompt."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: Text


class PairCreate(BaseModel):
    """A same-seed baseline/candidate pair."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt: Text
    seed: int | None = None
    tier: Text
    target: Target | None = None
    force: bool | None = None
    steps: int | None = Field(None, description="candidate denoising steps (transformer forwards)")
    baseline_steps: int | None = Field(None, description="baseline denoising steps (transformer forwards)")
    trajectory: bool | None = Field(None, description="record both runs' trajectories: GET /v1/pairs/{id}/trajectory")


class VerdictCreate(BaseModel):
    """A reviewer's decision. With --auth the reviewer is the signed-in user."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None
    decision: Text = Field(examples=["accept", "reject"])
    reasons: list[Text] = Field(default_factory=list)
    notes: Text = ""
    change_note: Text | None = Field(None, description="why: required when correcting your earlier verdict")


class PromptCheckCreate(BaseModel):
    """A prompt to check against the loaded model's vocabulary before generating."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: Text


class VerdictWithdraw(BaseModel):
    """Withdraw your standing verdict on a pair; every version stays in the history."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None
    change_note: Text = Field(description="why it is withdrawn")


class BlindOpen(BaseModel):
    """Opt in to a blind review of a pair. With --auth the reviewer is the signed-in user."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None


class BlindAnswer(BaseModel):
    """The answer to a blind review; which clip was which is revealed in the response."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None
    answer: Text = Field(examples=["no_difference", "a_worse", "b_worse"])
    reasons: list[Text] = Field(default_factory=list, description="what you saw: required when a clip is worse")
    notes: Text = ""
    change_note: Text | None = Field(None, description="why: required when correcting your earlier verdict")


class CampaignCreate(BaseModel):
    """A review campaign: one tier configuration over a prompt suite (or pasted prompts) × seeds."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: Text | None = None
    tier: Text
    suite: Text | None = Field(None, description="a prompt suite: GET /v1/prompt-suites")
    prompts: Text | list[Text] | None = Field(None, description="pasted prompts: text, one per line, or a list")
    seeds: list[int] | None = Field(None, description="each prompt runs once per seed (default [0])")
    target: Target | None = None
    force: bool | None = None
    steps: int | None = None
    baseline_steps: int | None = None


class ExportCreate(BaseModel):
    """Pairs to export; empty means every approved pair."""

    model_config = ConfigDict(extra="forbid", strict=True)
    pair_ids: list[Text] = Field(default_factory=list, max_length=MAX_EXPORT_PAIRS)

