-- Tables of the first schema that nothing ever wrote: the brain keeps job states in
-- job_states and samples in job_sample_chunks, and the archiver keeps every event in
-- events_archive. Kept, they only suggested a second source of truth.
DROP TABLE IF EXISTS runtime_samples;
DROP TABLE IF EXISTS nodes;
DROP TABLE IF EXISTS jobs;
