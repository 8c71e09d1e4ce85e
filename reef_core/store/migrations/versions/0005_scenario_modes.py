"""per-scenario learning modes

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-20 10:00:00.000000

One row per scenario whose mode was set through the API, the CLI or the dashboard (a
scenario without a row runs in its configured mode). ``pool_after_record_seq`` and
``pool_after_report_seq`` are the watermark a scenario leaving ``record_only`` sets: records
and reports at or below them never become experience.
"""
from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('scenario_modes',
    sa.Column('scenario', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('mode', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('since', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.Column('set_by', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    sa.Column('pool_after_record_seq', sa.Integer(), nullable=True),
    sa.Column('pool_after_report_seq', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('scenario')
    )


def downgrade() -> None:
    op.drop_table('scenario_modes')
