"""The failed list's filter by exception class: a column for the class of each failed job's last error.

Rows copied before it hold None there; the cursors go back to the start, so
the next sync reads every failed job once more and fills the column in.
"""

from django.db import migrations, models


def read_failed_jobs_again(apps, schema_editor):
    apps.get_model("echomq", "MirrorCursor").objects.update(failed_through_ms=0)


class Migration(migrations.Migration):

    dependencies = [
        ("echomq", "0008_jobrecord_generated_id_length"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrecord",
            name="error_class",
            field=models.CharField(blank=True, max_length=255, null=True, verbose_name="exception class"),
        ),
        migrations.AddIndex(
            model_name="jobrecord",
            index=models.Index(fields=["state", "error_class"], name="echomq_job_state_errclass"),
        ),
        migrations.RunPython(read_failed_jobs_again, migrations.RunPython.noop),
    ]
