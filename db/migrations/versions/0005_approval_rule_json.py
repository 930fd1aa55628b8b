"""The approval rule as one JSON column (issue 41 item 4).

- approval_rules.rule_json: the rule's fields (db/rule.py ApprovalRule.as_dict) as canonical JSON, replacing the
  columns min_distinct_prompts, min_reviewers and max_rejects; each stored version keeps its values. A criterion
  added later needs no migration (a version stored before it reads the criterion's default).
- downgrade: the three columns back from the JSON (a criterion they have no column for is dropped; one missing
  from the JSON takes its default of the time: 3, 2, 0).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06 19:30:00
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | Sequence[str] | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The columns of revisions 0003-0004 and their defaults then (db/records.py ApprovalRule at 0004).
COLUMNS = {'min_distinct_prompts': 3, 'min_reviewers': 2, 'max_rejects': 0}


def _canonical(value: dict) -> str:
    # as db/keys.py canonical_json writes it
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def upgrade() -> None:
    with op.batch_alter_table('approval_rules', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rule_json', sa.Text(), nullable=True))
    connection = op.get_bind()
    rows = connection.execute(sa.text(f"SELECT seq, {', '.join(COLUMNS)} FROM approval_rules")).all()
    for seq, *values in rows:
        connection.execute(sa.text("UPDATE approval_rules SET rule_json = :rule WHERE seq = :seq"),
                           {"rule": _canonical(dict(zip(COLUMNS, values, strict=True))), "seq": seq})
    with op.batch_alter_table('approval_rules', schema=None) as batch_op:
        batch_op.alter_column('rule_json', existing_type=sa.Text(), nullable=False)
        for name in COLUMNS:
            batch_op.drop_column(name)


def downgrade() -> None:
    with op.batch_alter_table('approval_rules', schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=True))
    connection = op.get_bind()
    for seq, text in connection.execute(sa.text("SELECT seq, rule_json FROM approval_rules")).all():
        stored = json.loads(text)
        connection.execute(
            sa.text(f"UPDATE approval_rules SET {', '.join(f'{n} = :{n}' for n in COLUMNS)} WHERE seq = :seq"),
            {**{n: stored.get(n, default) for n, default in COLUMNS.items()}, "seq": seq})
    with op.batch_alter_table('approval_rules', schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.alter_column(name, existing_type=sa.Integer(), nullable=False)
        batch_op.drop_column('rule_json')
