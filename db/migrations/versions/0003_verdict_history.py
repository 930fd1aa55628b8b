"""Verdict history and a stored approval rule.

- verdicts.supersedes / verdicts.change_note: a correction or withdrawal is a new row naming the version it
  replaces; decision may now be 'withdrawn'. Existing verdicts stay as they are (each an original version).
- approval_rules: the rule an admin set (newest row applies); empty means the studio's configured default.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 15:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | Sequence[str] | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('verdicts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('supersedes', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('change_note', sa.Text(), nullable=True))
        batch_op.drop_constraint(op.f('ck_verdicts_decision'), type_='check')
        batch_op.create_check_constraint('decision', "decision IN ('accept', 'reject', 'withdrawn')")
    op.create_table('approval_rules',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('min_distinct_prompts', sa.Integer(), nullable=False),
    sa.Column('min_reviewers', sa.Integer(), nullable=False),
    sa.Column('max_rejects', sa.Integer(), nullable=False),
    sa.Column('changed_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_approval_rules'))
    )


def downgrade() -> None:
    op.drop_table('approval_rules')
    op.execute("DELETE FROM verdicts WHERE decision = 'withdrawn'")
    with op.batch_alter_table('verdicts', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_verdicts_decision'), type_='check')
        batch_op.create_check_constraint('decision', "decision IN ('accept', 'reject')")
        batch_op.drop_column('change_note')
        batch_op.drop_column('supersedes')
