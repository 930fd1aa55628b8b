"""Initial schema: clips, video jobs, configurations, pairs, verdicts.

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02 18:19:50.916594
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table('clips',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('size_bytes', sa.Integer(), nullable=False),
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('tier', sa.String(length=100), nullable=False),
    sa.Column('tier_config_hash', sa.String(length=64), nullable=False),
    sa.Column('duration_seconds', sa.Float(), nullable=False),
    sa.Column('requested_duration', sa.Float(), nullable=True),
    sa.Column('width', sa.Integer(), nullable=False),
    sa.Column('height', sa.Integer(), nullable=False),
    sa.Column('frames', sa.Integer(), nullable=False),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.Column('timings_json', sa.Text(), nullable=False),
    sa.Column('sidecar_json', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_clips'))
    )
    with op.batch_alter_table('clips', schema=None) as batch_op:
        batch_op.create_index('ix_clips_lookup', ['model_id', 'seed', 'width', 'height', 'tier_config_hash'], unique=False)

    op.create_table('configurations',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('tier_name', sa.String(length=100), nullable=False),
    sa.Column('tier_config_json', sa.Text(), nullable=False),
    sa.Column('duration_seconds', sa.Float(), nullable=False),
    sa.Column('pair_count', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_configurations'))
    )
    op.create_table('video_jobs',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('progress', sa.Integer(), nullable=False),
    sa.Column('tier', sa.String(length=100), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('request_json', sa.Text(), nullable=False),
    sa.Column('clip_sha', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('inference_time_s', sa.Float(), nullable=True),
    sa.Column('peak_memory_mb', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('completed_at', sa.DateTime(), nullable=True),
    sa.CheckConstraint("status IN ('queued', 'in_progress', 'completed', 'failed')", name=op.f('ck_video_jobs_status')),
    sa.CheckConstraint('progress BETWEEN 0 AND 100', name=op.f('ck_video_jobs_progress')),
    sa.ForeignKeyConstraint(['clip_sha'], ['clips.sha256'], name=op.f('fk_video_jobs_clip_sha_clips')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_video_jobs')),
    sa.UniqueConstraint('id', name=op.f('uq_video_jobs_id'))
    )
    with op.batch_alter_table('video_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_video_jobs_status'), ['status'], unique=False)

    op.create_table('pairs',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('tier_name', sa.String(length=100), nullable=False),
    sa.Column('tier_config_json', sa.Text(), nullable=False),
    sa.Column('target_json', sa.Text(), nullable=False),
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('configuration_key', sa.String(length=64), nullable=False),
    sa.Column('baseline_video_id', sa.String(length=64), nullable=True),
    sa.Column('candidate_video_id', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('metrics_json', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.CheckConstraint("status IN ('queued', 'in_progress', 'completed', 'failed')", name=op.f('ck_pairs_status')),
    sa.ForeignKeyConstraint(['baseline_video_id'], ['video_jobs.id'], name=op.f('fk_pairs_baseline_video_id_video_jobs')),
    sa.ForeignKeyConstraint(['candidate_video_id'], ['video_jobs.id'], name=op.f('fk_pairs_candidate_video_id_video_jobs')),
    sa.ForeignKeyConstraint(['configuration_key'], ['configurations.key'], name=op.f('fk_pairs_configuration_key_configurations')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_pairs')),
    sa.UniqueConstraint('id', name=op.f('uq_pairs_id'))
    )
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pairs_configuration_key'), ['configuration_key'], unique=False)
        batch_op.create_index(batch_op.f('ix_pairs_status'), ['status'], unique=False)

    op.create_table('verdicts',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('pair_id', sa.String(length=64), nullable=False),
    sa.Column('configuration_key', sa.String(length=64), nullable=False),
    sa.Column('reviewer', sa.String(length=200), nullable=False),
    sa.Column('decision', sa.String(length=10), nullable=False),
    sa.Column('reasons_json', sa.Text(), nullable=False),
    sa.Column('notes', sa.Text(), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('tier_config_json', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.CheckConstraint("decision IN ('accept', 'reject')", name=op.f('ck_verdicts_decision')),
    sa.ForeignKeyConstraint(['configuration_key'], ['configurations.key'], name=op.f('fk_verdicts_configuration_key_configurations')),
    sa.ForeignKeyConstraint(['pair_id'], ['pairs.id'], name=op.f('fk_verdicts_pair_id_pairs')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_verdicts')),
    sa.UniqueConstraint('id', name=op.f('uq_verdicts_id'))
    )
    with op.batch_alter_table('verdicts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_verdicts_configuration_key'), ['configuration_key'], unique=False)
        batch_op.create_index(batch_op.f('ix_verdicts_pair_id'), ['pair_id'], unique=False)



def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table('verdicts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_verdicts_pair_id'))
        batch_op.drop_index(batch_op.f('ix_verdicts_configuration_key'))

    op.drop_table('verdicts')
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pairs_status'))
        batch_op.drop_index(batch_op.f('ix_pairs_configuration_key'))

    op.drop_table('pairs')
    with op.batch_alter_table('video_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_video_jobs_status'))

    op.drop_table('video_jobs')
    op.drop_table('configurations')
    with op.batch_alter_table('clips', schema=None) as batch_op:
        batch_op.drop_index('ix_clips_lookup')

    op.drop_table('clips')
