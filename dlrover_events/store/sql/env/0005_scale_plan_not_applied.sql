-- The parts of a plan the operator did not apply (a partial result), each with why: a
-- plan delivered again after it applied is answered as it was the first time, parts and
-- all ([{"part": "training.local_batch_size", "reason": "..."}, ...]).
ALTER TABLE scale_plans ADD COLUMN not_applied jsonb NOT NULL DEFAULT '[]'::jsonb;
