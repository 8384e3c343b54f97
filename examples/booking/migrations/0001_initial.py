# The Booking model, moved here from the agents app (agents 0013_booking_to_example): the table agents_booking
# exists already, so the model is created in Django's state only, and the content type row (which permissions
# and the admin's history point at) moves from agents.booking to booking_example.booking.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

OLD_LABEL, NEW_LABEL = 'agents', 'booking_example'


def _content_type_move(apps, from_label, to_label):
    content_type = apps.get_model('contenttypes', 'ContentType')
    rows = content_type.objects.filter(app_label=from_label, model='booking')
    if content_type.objects.filter(app_label=to_label, model='booking').exists():
        return  # already there (created by hand, or moved before): leave both as they are
    rows.update(app_label=to_label)


def content_type_forward(apps, schema_editor):
    _content_type_move(apps, OLD_LABEL, NEW_LABEL)


def content_type_backward(apps, schema_editor):
    _content_type_move(apps, NEW_LABEL, OLD_LABEL)


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('agents', '0013_booking_to_example'),
        ('chat_sessions', '0009_session_lease'),
        ('contenttypes', '0002_remove_content_type_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Booking',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('reference', models.CharField(max_length=12, unique=True)),
                        ('flight_number', models.CharField(max_length=12)),
                        ('origin', models.CharField(max_length=80)),
                        ('destination', models.CharField(max_length=80)),
                        ('depart_date', models.DateField()),
                        ('return_date', models.DateField(blank=True, null=True)),
                        ('passengers', models.PositiveSmallIntegerField()),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('session', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='bookings', to='chat_sessions.chatsession')),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='bookings', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'agents_booking',
                        'ordering': ['-created_at'],
                        'constraints': [models.UniqueConstraint(fields=('session', 'flight_number', 'depart_date'), name='booking_once_per_session_flight')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_type_forward, content_type_backward),
    ]
