# Fan-out (ctx.map, ctx.workflows): a run's parent step and place, and the
# counts of each fan-out. Non-atomic: on PostgreSQL the unique index on the
# run table is built CONCURRENTLY, so a busy pikku_workflow_run is not locked
# against writes while it is built.

import django.db.models.deletion
from django.db import migrations, models

ITEM_INDEX = "pikku_run_fanout_item_uniq"


class AddUniqueConcurrently(migrations.AddConstraint):
    """
    AddConstraint, built on PostgreSQL as a unique index CONCURRENTLY (the
    same rule to the database: one row per parent step and place).
    """

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        table = schema_editor.quote_name(model._meta.db_table)
        columns = ", ".join(
            schema_editor.quote_name(model._meta.get_field(name).column) for name in self.constraint.fields
        )
        schema_editor.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {schema_editor.quote_name(self.constraint.name)} "
            f"ON {table} ({columns})"
        )

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(self.constraint.name)}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("pikku_django", "0008_schedules"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowFanOut",
            fields=[
                (
                    "step",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="fan_out",
                        serialize=False,
                        to="pikku_django.workflowstep",
                    ),
                ),
                ("kind", models.CharField(choices=[("map", "ctx.map"), ("workflows", "ctx.workflows")], max_length=16)),
                ("total", models.PositiveIntegerField()),
                (
                    "max_parallel",
                    models.PositiveIntegerField(blank=True, help_text="NULL: every item at once.", null=True),
                ),
                ("released", models.PositiveIntegerField(default=0, help_text="Items made due so far, in order.")),
                ("ended", models.PositiveIntegerField(default=0, help_text="Items finished (any outcome).")),
                ("halted", models.BooleanField(default=False, help_text="An item failed or was cancelled.")),
                (
                    "failed_run",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="pikku_django.workflowrun",
                    ),
                ),
            ],
            options={
                "db_table": "pikku_workflow_fanout",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="parent_index",
            field=models.PositiveIntegerField(
                blank=True, help_text="The place of this run's item among its parent step's items.", null=True
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="parent_step",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                help_text="The ctx.map() or ctx.workflows() step of the parent that started this run.",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="fanned_out",
                to="pikku_django.workflowstep",
            ),
        ),
        AddUniqueConcurrently(
            model_name="workflowrun",
            constraint=models.UniqueConstraint(fields=("parent_step", "parent_index"), name=ITEM_INDEX),
        ),
    ]
