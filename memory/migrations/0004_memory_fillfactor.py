from django.db import migrations


class Migration(migrations.Migration):
    """Leave room in each page so the access-count update that retrieval makes is a HOT update.

    Without free space every touched row gets a new tuple elsewhere, and each new tuple is inserted into
    the HNSW and GIN indexes again: ~2 ms per memory on the read path (bench/memory_scale.py).
    """

    dependencies = [("memory", "0003_tier1_partial_indexes")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE memory_memory SET (fillfactor = 80)",
            reverse_sql="ALTER TABLE memory_memory RESET (fillfactor)",
        )
    ]
