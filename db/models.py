"""SQLAlchemy 2 typed models: the schema the Alembic migration creates.

JSON payloads are stored as TEXT holding canonical JSON (SQLite has no JSON column type worth relying on);
timestamps are naive UTC (SQLite has no time zones), re-labelled as UTC when records are built.
Tables with a public string id also carry an integer ``seq`` primary key: it gives a stable creation order
for cursor pagination (``after=``) even when two rows share a timestamp.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Float, ForeignKey, Index, Integer, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints keep migrations reproducible (SQLite batch mode needs names to alter constraints).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base carrying the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ClipRow(Base):
    """A content-addressed MP4 and the facts from its sidecar needed for lookup (the table row; the store hands out
    db.records.ClipRecord, and the clip itself is engine.clip.Clip)."""

    __tablename__ = "clips"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    path: Mapped[str] = mapped_column(Text)  # relative to the data dir, so the dir can be moved
    size_bytes: Mapped[int] = mapped_column(Integer)
    model_id: Mapped[str] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(Integer)
    tier: Mapped[str] = mapped_column(String(100))
    tier_config_hash: Mapped[str] = mapped_column(String(64))
    duration_seconds: Mapped[float] = mapped_column(Float)  # actual length (frames / fps)
    requested_duration: Mapped[float | None] = mapped_column(Float)  # target.duration_seconds, if recorded
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    frames: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    timings_json: Mapped[str] = mapped_column(Text)
    sidecar_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column()

    # Baseline reuse looks clips up by exactly these columns.
    __table_args__ = (
        Index("ix_clips_lookup", "model_id", "seed", "width", "height", "tier_config_hash"),
    )


class VideoJob(Base):
    """One /v1/videos job (queued → in_progress → completed|failed)."""

    __tablename__ = "video_jobs"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    status: Mapped[str] = mapped_column(String(20), index=True)
    progress: Mapped[int] = mapped_column(Integer)
    tier: Mapped[str] = mapped_column(String(100))
    model: Mapped[str] = mapped_column(String(200))
    request_json: Mapped[str] = mapped_column(Text)
    clip_sha: Mapped[str | None] = mapped_column(ForeignKey("clips.sha256"))
    error: Mapped[str | None] = mapped_column(Text)
    inference_time_s: Mapped[float | None] = mapped_column(Float)
    peak_memory_mb: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column()
    completed_at: Mapped[datetime | None] = mapped_column()
    # A remote server's job, stored when the server accepts it ({"server", "video_id", "accepted_at"}), so a
    # restarted studio can pick the job up again instead of failing it.
    remote_json: Mapped[str | None] = mapped_column(Text)

    # Last line of defence: the store validates first, the database refuses what slips through.
    __table_args__ = (
        CheckConstraint("status IN ('queued', 'in_progress', 'completed', 'failed')", name="status"),
        CheckConstraint("progress BETWEEN 0 AND 100", name="progress"),
    )


class Configuration(Base):
    """Model + tier (name and parameters) + duration: the unit that reviewers approve."""

    __tablename__ = "configurations"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    model_id: Mapped[str] = mapped_column(String(200))
    tier_name: Mapped[str] = mapped_column(String(100))
    tier_config_json: Mapped[str] = mapped_column(Text)
    duration_seconds: Mapped[float] = mapped_column(Float)
    pair_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column()


class Pair(Base):
    """A same-seed baseline + candidate comparison of one configuration on one prompt."""

    __tablename__ = "pairs"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    prompt: Mapped[str] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(Integer)
    tier_name: Mapped[str] = mapped_column(String(100))
    tier_config_json: Mapped[str] = mapped_column(Text)
    target_json: Mapped[str] = mapped_column(Text)
    model_id: Mapped[str] = mapped_column(String(200))
    configuration_key: Mapped[str] = mapped_column(ForeignKey("configurations.key"), index=True)
    baseline_video_id: Mapped[str | None] = mapped_column(ForeignKey("video_jobs.id"))
    candidate_video_id: Mapped[str | None] = mapped_column(ForeignKey("video_jobs.id"))
    status: Mapped[str] = mapped_column(String(20), index=True)
    metrics_json: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column()

    __table_args__ = (
        CheckConstraint("status IN ('queued', 'in_progress', 'completed', 'failed')", name="status"),
    )


class Verdict(Base):
    """One version of a reviewer's verdict on a pair, with a snapshot of what was reviewed.

    Rows are never changed or deleted: a correction or a withdrawal ("withdrawn") is a new row that names the
    version it replaces (``supersedes``) and says why (``change_note``). Approval counts each reviewer's
    latest version per pair.
    """

    __tablename__ = "verdicts"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    pair_id: Mapped[str] = mapped_column(ForeignKey("pairs.id"), index=True)
    configuration_key: Mapped[str] = mapped_column(ForeignKey("configurations.key"), index=True)
    reviewer: Mapped[str] = mapped_column(String(200))
    decision: Mapped[str] = mapped_column(String(10))
    reasons_json: Mapped[str] = mapped_column(Text)
    notes: Mapped[str] = mapped_column(Text)
    prompt: Mapped[str] = mapped_column(Text)  # snapshot: approval counts distinct prompts per configuration
    tier_config_json: Mapped[str] = mapped_column(Text)  # snapshot of the exact tier configuration reviewed
    created_at: Mapped[datetime] = mapped_column()
    supersedes: Mapped[str | None] = mapped_column(String(64))  # the id of the version this one replaces
    change_note: Mapped[str | None] = mapped_column(Text)  # why it was corrected or withdrawn
    # A blind review: which clip was shown as A (the other was B) and what the reviewer answered; the decision
    # is derived from the answer (db/blind.py). NULL for a review that showed the clips by name.
    blind_a: Mapped[str | None] = mapped_column(String(10))
    blind_answer: Mapped[str | None] = mapped_column(String(20))

    __table_args__ = (
        CheckConstraint("decision IN ('accept', 'reject', 'withdrawn')", name="decision"),
        CheckConstraint("blind_a IS NULL OR blind_a IN ('baseline', 'candidate')", name="blind_a"),
        CheckConstraint("blind_answer IS NULL OR blind_answer IN ('no_difference', 'a_worse', 'b_worse')",
                        name="blind_answer"),
    )


class ApprovalRuleVersion(Base):
    """The approval rule as an admin set it; the newest row applies, older rows are its history."""

    __tablename__ = "approval_rules"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # the rule's fields (db/rule.py ApprovalRule.as_dict) as canonical JSON: a new criterion needs no migration
    rule_json: Mapped[str] = mapped_column(Text)
    changed_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column()


class BlindAssignment(Base):
    """The random order a reviewer was shown a pair's clips in, fixed when they opted in to a blind review (so a
    reload shows the same A and B) and answered by at most one verdict."""

    __tablename__ = "blind_assignments"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    pair_id: Mapped[str] = mapped_column(ForeignKey("pairs.id"), index=True)
    reviewer: Mapped[str] = mapped_column(String(200))
    a_role: Mapped[str] = mapped_column(String(10))  # the clip shown as A: baseline or candidate
    created_at: Mapped[datetime] = mapped_column()
    verdict_id: Mapped[str | None] = mapped_column(String(64))  # the verdict that answered it

    __table_args__ = (CheckConstraint("a_role IN ('baseline', 'candidate')", name="a_role"),)


class Campaign(Base):
    """A review campaign: one tier configuration over a prompt suite × seeds, queued pair by pair."""

    __tablename__ = "campaigns"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    tier: Mapped[str] = mapped_column(String(100))
    settings_json: Mapped[str] = mapped_column(Text)  # the pair payload's other fields (target, steps, ...)
    status: Mapped[str] = mapped_column(String(20))
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column()

    __table_args__ = (CheckConstraint("status IN ('running', 'finished', 'cancelled')", name="status"),)


class CampaignItem(Base):
    """One prompt × seed of a campaign: pending until the studio queues its pair."""

    __tablename__ = "campaign_items"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    campaign_id: Mapped[str] = mapped_column(ForeignKey("campaigns.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[str] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(20))
    pair_id: Mapped[str | None] = mapped_column(ForeignKey("pairs.id"), index=True)
    error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint("state IN ('pending', 'queued', 'failed', 'cancelled')", name="state"),
    )
