from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat_sessions", "0009_session_lease"),
    ]

    operations = [
        migrations.AddField(
            model_name="sessionlease",
            name="handed_over_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
