# The Booking model moved to the booking example (examples/booking/models.py, app label booking_example). Its
# table stays as it is (agents_booking): only Django's state changes here; the example's 0001_initial takes the
# model into its own state, with the content type row.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0012_key_variable'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='Booking')],
            database_operations=[],
        ),
    ]
