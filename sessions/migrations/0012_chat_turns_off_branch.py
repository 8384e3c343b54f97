"""``chat_turns_off_branch(user, session)``: the turns whose memories a session does not recall (the branch rule of
recall, docs/memory.md "Branches"), computed in the database so that retrieval reads it inside its own statements
(``memory.retrieval.sql.ON_BRANCH_SQL``): no round trip of its own, and for a person who never branched a chat an
index probe that finds nothing (``session_user_branches``)."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION chat_turns_off_branch(p_user bigint, p_session uuid) RETURNS bigint[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
WITH RECURSIVE fam AS MATERIALIZED (
    -- The person's sessions of branched chats (index session_user_branches): none for most people.
    SELECT id, parent_id, fork_seq, chat_root FROM chat_sessions_chatsession
    WHERE user_id = p_user AND chat_root IS NOT NULL
), lineage(id, below) AS (
    -- The session's branch: itself (every turn), its parent below its fork point, and so on up.
    SELECT id, NULL::integer FROM fam WHERE id = p_session
    UNION ALL
    SELECT f.parent_id, LEAST(l.below, f.fork_seq)
    FROM lineage l JOIN fam f ON f.id = l.id
    WHERE f.parent_id IS NOT NULL AND f.fork_seq IS NOT NULL
), edited(id, first, below) AS (
    -- Turns a fork edited away (or regenerated): its parent's from its fork point on ...
    SELECT parent_id, fork_seq, NULL::integer FROM fam WHERE parent_id IS NOT NULL AND fork_seq IS NOT NULL
    UNION ALL
    -- ... where those were copies, the turns they were copied from: the parent's parent, below the parent's fork.
    SELECT p.parent_id, e.first, LEAST(e.below, p.fork_seq)
    FROM edited e JOIN fam p ON p.id = e.id
    WHERE p.parent_id IS NOT NULL AND p.fork_seq IS NOT NULL AND e.first < LEAST(e.below, p.fork_seq)
)
SELECT COALESCE(array_agg(t.id), '{}'::bigint[])
FROM fam JOIN chat_sessions_turn t ON t.session_id = fam.id
WHERE (
    fam.chat_root = (SELECT chat_root FROM fam WHERE id = p_session)
    OR EXISTS (
        SELECT 1 FROM edited e WHERE e.id = t.session_id AND t.seq >= e.first AND (e.below IS NULL OR t.seq < e.below)
    )
)
  AND NOT EXISTS (SELECT 1 FROM lineage l WHERE l.id = t.session_id AND (l.below IS NULL OR t.seq < l.below))
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("chat_sessions", "0011_session_branches")]

    operations = [
        migrations.RunSQL(CREATE, reverse_sql="DROP FUNCTION IF EXISTS chat_turns_off_branch(bigint, uuid);"),
    ]
