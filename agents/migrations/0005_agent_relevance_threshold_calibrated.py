"""``Agent.relevance_threshold`` may be blank: the calibrated relevance filter (memory.selectors).

Agents still on the old default of 0.5 move to the calibrated filter: on data it was not tuned on, the
fixed 0.5 dropped most relevant memories (bench/memory_eval.py). Any other value was someone's choice and
stays.
"""

import django.core.validators
from django.db import migrations, models


def calibrate_defaults(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("agents", "Agent").objects.filter(relevance_threshold=0.5).update(relevance_threshold=None)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0004_agent_is_active_help"),
    ]

    operations = [
        migrations.AlterField(
            model_name="agent",
            name="relevance_threshold",
            field=models.FloatField(
                blank=True,
                default=None,
                help_text=(
                    "Blank (recommended): memories are kept by how they compare with the best match for each "
                    "message (calibrated), or by the cheap model's score of 0.5 when one is configured. A number: "
                    "an absolute cut-off instead (0 keeps every candidate)."
                ),
                null=True,
                validators=[django.core.validators.MinValueValidator(0.0), django.core.validators.MaxValueValidator(1.0)],
            ),
        ),
        migrations.RunPython(calibrate_defaults, migrations.RunPython.noop, elidable=True),
    ]
