"""Alembic environment: uses the connection Reef passes in, or the configured URL."""

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

from reef_core.store import models  # noqa: F401  (registers the tables)

target_metadata = SQLModel.metadata


def run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


conn = context.config.attributes.get("connection")
if conn is not None:
    run(conn)
else:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.begin() as c:
        run(c)
