"""repair: node states of the repair loop, node events, repair cycles and steps, the pause

Node states become in_service | quarantined | draining | remediating | validating | out_of_service |
rma | lost. Old rows: 'cordoned' (a cluster admin's cordon) stays in service with cordoned_by set;
'unhealthy' and 'in_repair' become out_of_service (a human looks at them once and returns them with
`dlts node return`: the old states said nothing about what was done); 'lost' stays lost.
nodes.repair_state goes (repair cycles replace it).

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')
NEW_STATES = ('in_service', 'quarantined', 'draining', 'remediating', 'validating', 'out_of_service', 'rma', 'lost')
OLD_STATES = ('in_service', 'cordoned', 'unhealthy', 'in_repair', 'lost')


def upgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('state_reason', sa.String(length=512), nullable=True))
        batch_op.add_column(sa.Column('state_changed_at', _TS, nullable=True))
        batch_op.add_column(sa.Column('repair_scope', sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column('unhealthy_gpus', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('repair_paused', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('cordoned_by', sa.String(length=64), nullable=True))
    nodes = sa.table('nodes', sa.column('state', sa.String), sa.column('state_reason', sa.String),
                     sa.column('cordoned_by', sa.String), sa.column('repair_state', sa.String),
                     sa.column('repair_scope', sa.String), sa.column('unhealthy_gpus', sa.JSON))
    op.execute(nodes.update().values(unhealthy_gpus=[]))
    op.execute(nodes.update().where(nodes.c.state == 'cordoned')
               .values(state='in_service', cordoned_by='admin (before 0006)'))
    for old in ('unhealthy', 'in_repair'):
        op.execute(nodes.update().where(nodes.c.state == old).values(
            state='out_of_service', repair_scope='node',
            state_reason=f"was '{old}' before the repair loop; check it and return it with `dlts node return`"))
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.alter_column('state', existing_type=sa.Enum(*OLD_STATES, name='nodestate', native_enum=False, length=32),
                              type_=sa.Enum(*NEW_STATES, name='nodestate', native_enum=False, length=32),
                              existing_nullable=False)
        batch_op.alter_column('unhealthy_gpus', existing_type=sa.JSON(), nullable=False)
        batch_op.drop_column('repair_state')
    op.create_table('node_events',
    sa.Column('id', _ID, nullable=False),
    sa.Column('node_id', _ID, nullable=False),
    sa.Column('at', _TS, nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('from_state', sa.String(length=32), nullable=True),
    sa.Column('to_state', sa.String(length=32), nullable=True),
    sa.Column('reason', sa.String(length=64), nullable=True),
    sa.Column('message', sa.String(length=1024), nullable=True),
    sa.Column('actor', sa.String(length=64), nullable=True),
    sa.Column('cycle_id', _ID, nullable=True),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_node_events_node_id_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_node_events'))
    )
    with op.batch_alter_table('node_events', schema=None) as batch_op:
        batch_op.create_index('ix_node_events_node_id_id', ['node_id', 'id'], unique=False)
    op.create_table('repair_cycles',
    sa.Column('id', _ID, nullable=False),
    sa.Column('node_id', _ID, nullable=False),
    sa.Column('open_node_id', _ID, nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('rule', sa.String(length=128), nullable=True),
    sa.Column('scope', sa.String(length=8), nullable=False),
    sa.Column('gpus', sa.JSON(), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('problem', sa.String(length=512), nullable=False),
    sa.Column('triggers', sa.JSON(), nullable=False),
    sa.Column('steps', sa.JSON(), nullable=False),
    sa.Column('step_index', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('flap', sa.Boolean(), nullable=False),
    sa.Column('started_by', sa.String(length=64), nullable=False),
    sa.Column('started_at', _TS, nullable=False),
    sa.Column('queued_until', _TS, nullable=True),
    sa.Column('validation_since', _TS, nullable=True),
    sa.Column('ended_at', _TS, nullable=True),
    sa.Column('outcome', sa.String(length=32), nullable=True),
    sa.Column('message', sa.String(length=1024), nullable=True),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_repair_cycles_node_id_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_repair_cycles')),
    sa.UniqueConstraint('open_node_id', name=op.f('uq_repair_cycles_open_node_id'))
    )
    with op.batch_alter_table('repair_cycles', schema=None) as batch_op:
        batch_op.create_index('ix_repair_cycles_node_id_id', ['node_id', 'id'], unique=False)
        batch_op.create_index('ix_repair_cycles_ended_at', ['ended_at'], unique=False)
    op.create_table('repair_steps',
    sa.Column('id', _ID, nullable=False),
    sa.Column('cycle_id', _ID, nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('remediation', sa.String(length=32), nullable=False),
    sa.Column('target', sa.String(length=128), nullable=True),
    sa.Column('order_ids', sa.JSON(), nullable=False),
    sa.Column('started_at', _TS, nullable=False),
    sa.Column('deadline_at', _TS, nullable=True),
    sa.Column('ended_at', _TS, nullable=True),
    sa.Column('result', sa.String(length=16), nullable=True),
    sa.Column('message', sa.String(length=1024), nullable=True),
    sa.ForeignKeyConstraint(['cycle_id'], ['repair_cycles.id'], name=op.f('fk_repair_steps_cycle_id_repair_cycles'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_repair_steps')),
    sa.UniqueConstraint('cycle_id', 'number', name=op.f('uq_repair_steps_cycle_id_number'))
    )
    op.create_table('repair_control',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('paused', sa.Boolean(), nullable=False),
    sa.Column('paused_by', sa.String(length=64), nullable=True),
    sa.Column('paused_at', _TS, nullable=True),
    sa.Column('reason', sa.String(length=512), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_repair_control'))
    )


def downgrade() -> None:
    op.drop_table('repair_control')
    op.drop_table('repair_steps')
    # the tables' indexes go with them (MariaDB refuses to drop an index a foreign key needs first)
    op.drop_table('repair_cycles')
    op.drop_table('node_events')
    nodes = sa.table('nodes', sa.column('state', sa.String), sa.column('cordoned_by', sa.String))
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('repair_state', sa.String(length=32), nullable=True))
    op.execute(nodes.update().where(nodes.c.state.in_(['quarantined', 'draining', 'remediating', 'validating']))
               .values(state='in_repair'))
    op.execute(nodes.update().where(nodes.c.state.in_(['out_of_service', 'rma'])).values(state='unhealthy'))
    op.execute(nodes.update().where(nodes.c.state == 'in_service', nodes.c.cordoned_by.isnot(None)).values(state='cordoned'))
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.alter_column('state', existing_type=sa.Enum(*NEW_STATES, name='nodestate', native_enum=False, length=32),
                              type_=sa.Enum(*OLD_STATES, name='nodestate', native_enum=False, length=32),
                              existing_nullable=False)
        batch_op.drop_column('cordoned_by')
        batch_op.drop_column('repair_paused')
        batch_op.drop_column('unhealthy_gpus')
        batch_op.drop_column('repair_scope')
        batch_op.drop_column('state_changed_at')
        batch_op.drop_column('state_reason')
