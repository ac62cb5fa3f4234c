-- Fencing: an env's incarnation changes when it is deleted and created again, so a
-- process that started on the old one can tell; `deleting_since` marks an env whose
-- deletion waits for its running processes to stop (the name is not free until then).
ALTER TABLE envs ADD COLUMN incarnation uuid NOT NULL DEFAULT gen_random_uuid();
ALTER TABLE envs ADD COLUMN deleting_since timestamptz;
