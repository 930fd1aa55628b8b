"""Alembic environment for the studio database.

The store runs migrations in-process and hands over its own connection through
``config.attributes["connection"]`` so the SQLite pragmas apply; without one (e.g. running
``alembic`` by hand with a Config whose ``sqlalchemy.url`` is set) a plain engine is built from the URL.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from db.models import Base

target_metadata = Base.metadata


def _configure_and_run(connection: Connection) -> None:
    """Run migrations on ``connection``; batch mode because SQLite cannot ALTER most things in place."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of executing it (``alembic upgrade --sql``)."""
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Use the caller's connection if given, else connect to ``sqlalchemy.url``."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _configure_and_run(conn)
        conn.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
