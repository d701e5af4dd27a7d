"""The incidents, and their reports apart.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("verdict", sa.Text(), nullable=False),
        sa.Column("culprits", sa.Text(), nullable=False),
        sa.Column("confidence", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("detected_at", sa.Double(), nullable=False),
        sa.Column("diagnosed_at", sa.Double(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("ended_at", sa.Double(), nullable=True),
    )
    op.create_index("ix_incidents_detected_at", "incidents", ["detected_at"])
    op.create_index("ix_incidents_job", "incidents", ["job"])
    op.create_index("ix_incidents_fingerprint", "incidents", ["fingerprint"])
    op.create_table(
        "incident_reports",
        sa.Column(
            "incident_id",
            sa.Integer(),
            sa.ForeignKey("incidents.id", ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("report_json", sa.Text(), nullable=False),
        sa.Column("report_html", sa.Text(), nullable=False),
        sa.Column("bundle", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("incident_reports")
    op.drop_table("incidents")
