"""evaluation episodes; consumption that returns to the pool

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 10:12:00.000000

Existing consumption rows become ``held`` after one attempt: what earlier versions consumed
stays consumed, as it did then.
"""
from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('episodes',
    sa.Column('candidate_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.Text(), nullable=False),
    sa.Column('side', sa.Text(), nullable=False),
    sa.Column('repeat', sa.Integer(), nullable=False),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('grader', sa.Text(), nullable=False),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('answer', sa.Text(), nullable=True),
    sa.Column('request', sa.LargeBinary(), nullable=True),
    sa.Column('request_base', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('candidate_id', 'position')
    )
    with op.batch_alter_table('consumption', schema=None) as batch_op:
        batch_op.add_column(sa.Column('state', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False,
                                      server_default='held'))
        batch_op.add_column(sa.Column('attempts', sa.Integer(), nullable=False, server_default='1'))
        batch_op.add_column(sa.Column('base_release_id', sqlmodel.sql.sqltypes.AutoString(length=100),
                                      nullable=True))
        batch_op.add_column(sa.Column('returned_after_seq', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('consumption', schema=None) as batch_op:
        batch_op.drop_column('returned_after_seq')
        batch_op.drop_column('base_release_id')
        batch_op.drop_column('attempts')
        batch_op.drop_column('state')

    op.drop_table('episodes')
