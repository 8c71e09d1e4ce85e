"""record the policy's top-K logprobs per response token

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-14 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('records', schema=None) as batch_op:
        batch_op.add_column(sa.Column('top_logprobs', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('records', schema=None) as batch_op:
        batch_op.drop_column('top_logprobs')
