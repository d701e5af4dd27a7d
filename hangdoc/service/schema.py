"""The incident store's tables, as the store queries them.

The migrations in ``migrations/versions`` create these tables with their own explicit
definitions (a migration never changes once released); a test checks that the newest
migration and this module agree. Change a table here and add a migration beside it.
"""

from __future__ import annotations

from sqlalchemy import Column, Double, ForeignKey, Index, Integer, LargeBinary, MetaData, Table, Text

metadata = MetaData()

incidents = Table(
    "incidents",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job", Text, nullable=False),
    Column("nodes", Text, nullable=False),  # JSON list of node names
    Column("verdict", Text, nullable=False),
    Column("culprits", Text, nullable=False),  # JSON list of rank numbers
    Column("confidence", Text, nullable=False),
    Column("summary", Text, nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("detected_at", Double, nullable=False),
    Column("diagnosed_at", Double, nullable=False),
    Column("state", Text, nullable=False),
    Column("ended_at", Double, nullable=True),
)
Index("ix_incidents_detected_at", incidents.c.detected_at)
Index("ix_incidents_job", incidents.c.job)
Index("ix_incidents_fingerprint", incidents.c.fingerprint)

# the large parts apart, so that listing incidents never reads them
incident_reports = Table(
    "incident_reports",
    metadata,
    Column(
        "incident_id", Integer, ForeignKey("incidents.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    ),
    Column("report_json", Text, nullable=False),
    Column("report_html", Text, nullable=False),
    Column("bundle", LargeBinary, nullable=False),
)
