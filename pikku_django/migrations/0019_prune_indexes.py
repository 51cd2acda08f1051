# The runs that have a parent, indexed on their own: most runs have none, so
# with planner statistics the parent_id index (one key for every run without
# a parent) looks to SQLite like a scan of the table, and the retention
# prune's lookups of the children of the runs it picks scanned every run.
# Non-atomic: on PostgreSQL the index is built CONCURRENTLY, so a busy
# pikku_workflow_run is not locked against writes while it is built.

import pikku_django.models
from django.db import migrations, models


class AddIndexConcurrently(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL (the same index)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("pikku_django", "0018_charts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=pikku_django.models.PartialIndex(
                fields=["parent", "status"], name="pikku_run_child_idx", where=models.Q(("parent__isnull", False))
            ),
        ),
    ]
