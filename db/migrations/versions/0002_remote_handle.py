"""Video jobs remember the remote server's job (server name, remote video id), so a restart can resume it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 09:25:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | Sequence[str] | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add video_jobs.remote_json (nullable: local jobs and jobs stored before have none)."""
    with op.batch_alter_table('video_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('remote_json', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('video_jobs', schema=None) as batch_op:
        batch_op.drop_column('remote_json')
