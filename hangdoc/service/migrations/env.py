"""alembic's environment for the incident store: online only, on the connection (already in
its transaction, under the store's migration lock) that ``Store.open`` passes in
``config.attributes["connection"]``."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from hangdoc.service.schema import metadata


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("the incident store's migrations run from Store.open, which passes its connection")
    # transactional on SQLite too: the store emits BEGIN itself (store._sqlite_engine)
    context.configure(connection=connection, target_metadata=metadata, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("the incident store's migrations run online only (Store.open), not as SQL scripts")
run_online()
