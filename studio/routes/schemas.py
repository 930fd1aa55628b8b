"""The /v1 response bodies as pydantic models: what the OpenAPI schema (/docs) shows a client, field by field.

The routes still build plain dicts (studio/routes/objects.py: video_object, pair_object, …); FastAPI validates
each against its route's ``response_model`` and serialises it. Why ``extra="allow"``: a field a service adds before
its model does still reaches the client rather than being dropped; tests/test_api.py checks that the main objects
carry no field their model lacks, so the schema stays complete. Timestamps stay the strings the service makes (pydantic
would rewrite "+00:00" as "Z"), and every number is what the service computed.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from db.rule import ApprovalRule, Criterion
from quality.summary import AudioSummary, FrameMetrics

__all__ = [
    "ApprovalRuleObject", "ConfigurationList", "ConfigurationObject", "PairList", "PairObject", "QueueObject",
    "RemoteList", "TierList", "TrajectoryObject", "VerdictObject", "VideoDeleted", "VideoList", "VideoObject",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------------------------------- videos


class VideoObject(_Body):
    """A job in SGLang's /v1/videos shape, plus the studio's tier, prompt, queue position and timings."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal["queued", "in_progress", "completed", "failed"]
    progress: int = Field(description="0-100; denoising steps done")
    created_at: int | None = Field(description="Unix seconds")
    completed_at: int | None = None
    size: str = Field("", description='"WIDTHxHEIGHT" of the canvas; "" when not known yet')
    seconds: str = Field("", description='the clip\'s real length (frames / 24), e.g. "5.166667" for a 5 s request; '
                                         '"" when not known yet')
    error: dict[str, str] | None = Field(None, description='{"code": "failed" | "cancelled", "message": ...} when '
                                                           'failed')
    remixed_from_video_id: str | None = Field(None, description="POST /v1/videos/{id}/remix: the source video")
    task: Literal["t2va", "fl2va", "ref2va"] = Field("t2va", description="MiniMax-H3's task: text, keyframes "
                                                                         "(fl2va) or reference images (ref2va)")
    inference_time_s: float | None = None
    peak_memory_mb: float | None = None
    tier: str
    prompt: str
    seed: int | None = None
    queue_position: int | None = Field(None, description="0 running, 1.. waiting, null when not queued")
    timings: dict[str, Any] = Field(default_factory=dict, description="seconds per engine stage")
    tokens: int | None = None
    compiles: dict[str, Any] | None = Field(None, description="kernel compile keys this clip used")
    engine: str = Field("local", description='"local", or "remote NAME" when a remote server made it')
    client_time_s: float | None = Field(None, description="remote clips: POST to downloaded MP4, as measured here")
    remote_job: dict[str, Any] | None = Field(None, description="the remote server's job once it accepted it")


class VideoCancelled(VideoObject):
    """DELETE on a queued or running job: it is cancelled (and stays listed as failed)."""

    deleted: Literal[False] = False
    cancelled: Literal[True] = True


class VideoDeleted(_Body):
    """DELETE on a finished job: its record is gone."""

    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: Literal[True] = True


class _Page(_Body):
    object: Literal["list"] = "list"
    has_more: bool
    first_id: str | None = None
    last_id: str | None = Field(None, description="pass as `after` for the next page")


class VideoList(_Page):
    data: list[VideoObject]


# ------------------------------------------------------------------------------------------- pairs


class PairVideo(_Body):
    """One clip of a pair (studio/views.py VideoView)."""

    id: str
    status: str
    progress: int
    tier: str
    model: str
    prompt: str
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    seconds: float | None = None
    created_at: str
    completed_at: str | None = None
    error: str | None = None
    inference_time_s: float | None = None
    peak_memory_mb: float | None = None
    queue_position: int | None = None
    clip_sha: str | None = None
    timings: dict[str, Any] = Field(default_factory=dict)
    reused_clip: bool = False
    request: dict[str, Any] = Field(default_factory=dict)
    tokens: int | None = None
    compiles: dict[str, Any] | None = None
    engine: str = "local"
    client_time_s: float | None = None
    remote_job: dict[str, Any] | None = None


class GateObject(_Body):
    value: float | None
    limit: float | list[float] | None = Field(description="a number, a [low, high] range, or null: not gated")
    passed: bool | None = Field(description="null: recorded only, or not evaluated (value missing)")
    frames: list[int] | None = Field(None, description="[first, last] frame the gate is about (its worst window)")
    frame: int | None = Field(None, description="the worst single frame there: where Compare jumps")
    text: str | None = Field(None, description="what failed, in a reviewer's words (null when it passed)")


class QualityMetrics(_Body):
    """A pair's quality summary (quality/summary.py QualitySummary.to_json)."""

    frames: int
    psnr_mean: float
    ssim_mean: float
    ghosting: bool
    ghost_score: float
    worst_frame: int | None = None
    worst_by: str | None = Field(None, description="the failed gate worst_frame comes from; null: lowest SSIM")
    ghost_peak_frame: int | None = None
    subject_lost_frames: list[list[int]] | None = Field(None, description="[first, last] runs without the subject")
    subject_present: float | None = None
    subject_displacement_px: float | None = None
    subject_fragments: float | None = None
    subject_colour_delta: float | None = None
    subject_patch: float | None = Field(None, description="worst-window share of the subject in a blotch of another "
                                        "colour")
    subject_flip: float | None = None
    per_frame: list[FrameMetrics]
    gates: dict[str, GateObject]
    suggested_verdict: Literal["accept", "reject"] = Field(description="a machine suggestion, never the verdict")
    suggestion_reasons: list[str] = Field(default_factory=list)
    lpips_delta: float | None = None
    lpips_reason: str | None = None
    sharpness_ratio: float | None = None
    temporal_jitter_ratio: float | None = None
    temporal_consistency: float | None = None
    flip: float | None = None
    flip_reason: str | None = None
    audio: AudioSummary | None = None
    overlay_frames: int = Field(0, description="frames with overlay images (diff, ghost, FLIP), shown in the UI's "
                                            "Compare tab; REST does not name files on the studio's disk")


class VerdictObject(_Body):
    """One version of a reviewer's verdict, with the tier configuration exactly as reviewed."""

    object: Literal["verdict"] | None = None
    id: str
    pair_id: str
    configuration_key: str
    reviewer: str
    decision: Literal["accept", "reject", "withdrawn"]
    reasons: list[str]
    notes: str
    prompt: str
    tier_config: dict[str, Any]
    created_at: str
    supersedes: str | None = Field(None, description="the version this one corrects or withdraws")
    change_note: str | None = None
    blind_a: str | None = Field(None, description="a blind review: the clip shown as A")
    blind_answer: str | None = None


class PairObject(_Body):
    """A same-seed pair: both clips, timings, speed-ups, cost, quality metrics and verdicts."""

    object: Literal["pair"] = "pair"
    id: str
    status: Literal["queued", "in_progress", "completed", "failed"]
    prompt: str
    seed: int
    tier: str
    tier_config: dict[str, Any] = Field(description="the configuration the candidate clip ran (and its baseline's)")
    target: dict[str, Any]
    model_id: str
    configuration_key: str
    created_at: str
    updated_at: str
    error: str | None = None
    baseline: PairVideo | None = None
    candidate: PairVideo | None = None
    baseline_reused: bool
    speedup: float | None = Field(None, description="baseline inference_time_s / candidate inference_time_s")
    denoise_speedup: float | None = None
    cost_usd: dict[str, float | None] = Field(description="per clip at the pod rate")
    metrics: QualityMetrics | None = Field(None, description='null unless metrics_status is "ok"')
    metrics_status: Literal["ok", "pending", "unavailable", "error", "not computed"]
    metrics_message: str
    verdicts: list[VerdictObject] = Field(default_factory=list)
    baseline_steps: int | None = None
    speedup_caveat: str | None = None
    prompt_notes: list[str] = Field(default_factory=list,
                                    description="what the pair's model does not know in its prompt (unknown words, "
                                                "content it names none of); empty for a model without a prompt guide")
    baseline_video_id: str | None = None
    candidate_video_id: str | None = None
    trajectory: dict[str, Any] | None = Field(
        None, description='a pair submitted with "trajectory": true: {"recorded": true, "bytes_bound": per run, the '
                          'pooled x0 it holds (stated before it ran), "stored_bytes": per run once stored}; '
                          "GET /v1/pairs/{id}/trajectory compares them; null when not recorded")
    baseline_content_url: str | None = None
    candidate_content_url: str | None = None


class TrajectoryStep(_Body):
    step: int
    t: float
    overall: float | None
    subject: float | None = None
    background: float | None = None
    base: dict[str, Any] = Field(description="what the baseline's step did: attention dense|sparse|mixed, cache, "
                                             "techniques on at every step (always)")
    candidate: dict[str, Any] = Field(description="what the candidate's step did (same keys; sol_error {calls, max, "
                                                  "mean}: the step's sparse calls against dense attention)")


class TrajectoryObject(_Body):
    """Where a recorded pair's two runs part (studio/trajectory.py): per step, the RMS difference of their pooled
    x0 relative to the baseline's, overall and on the baseline's subject; the per-cell heat map; the first step over
    the threshold."""

    object: Literal["pair.trajectory"] = "pair.trajectory"
    pair_id: str
    steps: list[TrajectoryStep]
    heat: list[list[list[float]]] = Field(description="(steps, rows, columns): each cell's divergence")
    grid: list[int]
    latent_frames: int
    threshold: float
    measure: Literal["subject", "overall"] = Field(description="what first_over reads (subject unless it has none)")
    first_over: int | None = Field(description="the first step whose divergence exceeds the threshold")
    subject_cells: float | None = None
    aligned: str | None = Field(None, description="set when the runs' step counts differ: how they were aligned")
    runs: dict[str, Any]
    preview: dict[str, Any] = Field(
        description='what the x0 previews are - kind "vae_window" (the VAE on one window of each step\'s x0; '
                    '"frames": their indices in the clip) or "linear" (a latent-to-RGB map: pairs recorded before) - '
                    'and "fidelity": that kind\'s fidelity measured on held-out steps and prompts against the VAE '
                    'decode of the whole x0 (bench/trajectory_fidelity.py), not a fit\'s in-sample error')
    sol_gate: dict[str, Any] = Field(
        description="per run (baseline, candidate): where sparse attention ran, the Sol-Attn gate - each step's "
                    "relative error ||sparse - dense|| / ||dense|| of the attention output against dense attention "
                    "on the same inputs, max and mean over the step's sparse calls (null on steps without one), "
                    "calls, and the running sums accumulated_max / accumulated_mean; null for a run without sparse "
                    "attention, {\"measured\": false} for one recorded before the gate")


class PairList(_Page):
    data: list[PairObject]


# ------------------------------------------------------------------------------- review, tiers, queue


def _criterion_field(criterion: Criterion, default: Any = ...) -> Any:
    """A rule criterion as a pydantic field: its label, help and bounds (in the schema; the rule checks them, so an
    out-of-range value gets the rule's 400 naming the field, after the admin check, on every path alike)."""
    bounds = f"{criterion.minimum}..{criterion.maximum}"
    return Field(default, title=criterion.label, description=f"{criterion.help} ({bounds})",
                 json_schema_extra={"minimum": criterion.minimum, "maximum": criterion.maximum})


@functools.cache
def rule_models(rule_class: type[ApprovalRule]) -> tuple[type[BaseModel], type[BaseModel], type[BaseModel]]:
    """The REST models of a rule class, built from its criteria (db/rule.py): (the rule with its version, the same
    with its history, the PUT body of the fields to change). ApprovalRule's are named ApprovalRuleObject,
    ApprovalRuleWithHistory and RuleUpdate."""
    criteria = rule_class.criteria()
    prefix = "" if rule_class is ApprovalRule else rule_class.__name__
    version = Field(None, description="how many rules admins have set (0: the default applies); send it back with a "
                                      "change to refuse it if someone changed the rule since")
    rule_object = create_model(
        f"{prefix or 'ApprovalRule'}Object", __base__=_Body,
        __doc__=f"The approval rule ({rule_class.__name__}, db/rule.py) and its version.",
        **{c.name: (c.type, _criterion_field(c)) for c in criteria}, version=(int | None, version))
    with_history = create_model(
        f"{prefix or 'ApprovalRule'}WithHistory", __base__=rule_object,
        history=(list[dict[str, Any]], Field(description="every rule an admin set, oldest first")))
    update = create_model(
        f"{prefix}RuleUpdate", __config__=ConfigDict(extra="forbid", strict=True),
        __doc__="Admin only: the approval rule's fields to change (omitted ones keep their value).",
        **{c.name: (c.type | None, _criterion_field(c, None)) for c in criteria},
        version=(int | None, Field(None, description="the rule version you read (GET /v1/approval-rule): when another "
                                                     "admin changed the rule since, 409 naming version")))
    return rule_object, with_history, update


ApprovalRuleObject, ApprovalRuleWithHistory, RuleUpdate = rule_models(ApprovalRule)


class ConfigurationObject(_Body):
    """A tier configuration with its approval tally (GET by key adds `history`: every verdict version)."""

    key: str
    model_id: str
    tier_name: str
    tier_config: dict[str, Any]
    duration_seconds: float
    pair_count: int
    created_at: str
    updated_at: str
    approved: bool
    accepts: int
    rejects: int
    distinct_accepted_prompts: int
    accepted_prompts: list[str]
    accepted_prompts_with_unknown_words: list[str] = Field(
        default_factory=list, description="accepted prompts with words the model was never trained on (its prompt "
                                          "guide); clips of those say little about the tier. Not part of the rule")
    accepting_reviewers: list[str]
    versions: int
    blind: dict[str, Any] = Field(default_factory=dict, description="how often blind reviewers told the clips apart")
    rule: ApprovalRuleObject
    history: list[VerdictObject] | None = None
    campaigns: list[dict[str, Any]] | None = Field(None, description="GET by key: the campaigns reviewing it")


class ConfigurationList(_Body):
    object: Literal["list"] = "list"
    data: list[ConfigurationObject]
    approval_rule: ApprovalRuleObject


class TierRow(_Body):
    """A tier and whether it can serve a clip of the asked duration (with the reason when not)."""

    name: str
    steps: int | None = Field(description="null: a remote tier that runs its server's default")
    status: str
    available: bool
    reason: str
    techniques: list[str]
    description: str
    config: dict[str, Any]
    random_weights: bool | None = None
    lora_weights: str | None = None
    lora_text: str | None = None
    remotes: list[dict[str, Any]] | None = None


class PromptCheckObject(_Body):
    """What the model will not understand in a prompt. `guided` is false for a model without a prompt guide (a real
    checkpoint takes any text): then nothing is flagged."""

    object: Literal["prompt_check"] = "prompt_check"
    model: str
    guided: bool
    clean: bool = Field(description="no unknown word, and a colour, shape and motion the model knows are named")
    unknown_words: list[str] = Field(default_factory=list, description="words outside the model's training captions")
    replacements: dict[str, str] = Field(default_factory=dict, description="a known word for each it can suggest")
    missing: list[str] = Field(default_factory=list, description='"colour", "shape", "motion": named none of')
    suggestion: str | None = Field(None, description="the prompt with every unknown word replaced, if each has one")
    notes: list[str] = Field(default_factory=list)
    examples: list[str] = Field(default_factory=list, description="prompts the model follows")


class TierList(_Body):
    object: Literal["list"] = "list"
    data: list[TierRow]


class QueueObject(_Body):
    running: str | None = Field(description="the running job's video id")
    queued: list[str]
    max_queued: int


class RemoteList(_Body):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
