"""growth leases: one growth step per scenario across processes, with fencing tokens

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-21 10:00:00.000000

``growth_leases`` holds one row per scenario that ever ran a growth step: who holds the
scenario's lease (``host:pid:uuid``), until when (``expires_at``, seconds since the epoch on the
database's clock), and the fencing token, incremented on every acquisition. A candidate
records the token its step held (``candidates.lease_token``); publishing checks it.
"""
from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('growth_leases',
    sa.Column('scenario', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('holder', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('token', sa.BigInteger(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.Column('heartbeat_at', sa.Float(), nullable=False),
    sa.Column('acquired_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('scenario')
    )
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lease_token', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.drop_column('lease_token')
    op.drop_table('growth_leases')
