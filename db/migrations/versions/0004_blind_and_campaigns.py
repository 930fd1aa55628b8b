"""Blind A/B reviews and review campaigns.

- verdicts.blind_a / verdicts.blind_answer: a blind review records which clip was shown as A and the answer
  (no_difference, a_worse, b_worse); NULL for every verdict before this revision and for named reviews.
- blind_assignments: the random order a reviewer was shown, fixed when they opted in, answered by one verdict.
- campaigns / campaign_items: a tier configuration over a prompt suite x seeds; each item holds its pair once
  the studio queued it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | Sequence[str] | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('verdicts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('blind_a', sa.String(length=10), nullable=True))
        batch_op.add_column(sa.Column('blind_answer', sa.String(length=20), nullable=True))
        batch_op.create_check_constraint('blind_a', "blind_a IS NULL OR blind_a IN ('baseline', 'candidate')")
        batch_op.create_check_constraint(
            'blind_answer', "blind_answer IS NULL OR blind_answer IN ('no_difference', 'a_worse', 'b_worse')")
    op.create_table('blind_assignments',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('pair_id', sa.String(length=64), nullable=False),
    sa.Column('reviewer', sa.String(length=200), nullable=False),
    sa.Column('a_role', sa.String(length=10), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('verdict_id', sa.String(length=64), nullable=True),
    sa.CheckConstraint("a_role IN ('baseline', 'candidate')", name=op.f('ck_blind_assignments_a_role')),
    sa.ForeignKeyConstraint(['pair_id'], ['pairs.id'], name=op.f('fk_blind_assignments_pair_id_pairs')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_blind_assignments')),
    sa.UniqueConstraint('id', name=op.f('uq_blind_assignments_id'))
    )
    with op.batch_alter_table('blind_assignments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_blind_assignments_pair_id'), ['pair_id'], unique=False)
    op.create_table('campaigns',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('tier', sa.String(length=100), nullable=False),
    sa.Column('settings_json', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.CheckConstraint("status IN ('running', 'finished', 'cancelled')", name=op.f('ck_campaigns_status')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_campaigns')),
    sa.UniqueConstraint('id', name=op.f('uq_campaigns_id'))
    )
    op.create_table('campaign_items',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('campaign_id', sa.String(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('pair_id', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.CheckConstraint("state IN ('pending', 'queued', 'failed', 'cancelled')",
                       name=op.f('ck_campaign_items_state')),
    sa.ForeignKeyConstraint(['campaign_id'], ['campaigns.id'], name=op.f('fk_campaign_items_campaign_id_campaigns')),
    sa.ForeignKeyConstraint(['pair_id'], ['pairs.id'], name=op.f('fk_campaign_items_pair_id_pairs')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_campaign_items'))
    )
    with op.batch_alter_table('campaign_items', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_campaign_items_campaign_id'), ['campaign_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_campaign_items_pair_id'), ['pair_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('campaign_items', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_campaign_items_pair_id'))
        batch_op.drop_index(batch_op.f('ix_campaign_items_campaign_id'))
    op.drop_table('campaign_items')
    op.drop_table('campaigns')
    with op.batch_alter_table('blind_assignments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_blind_assignments_pair_id'))
    op.drop_table('blind_assignments')
    with op.batch_alter_table('verdicts', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_verdicts_blind_answer'), type_='check')
        batch_op.drop_constraint(op.f('ck_verdicts_blind_a'), type_='check')
        batch_op.drop_column('blind_answer')
        batch_op.drop_column('blind_a')
