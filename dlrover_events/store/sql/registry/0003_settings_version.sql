-- `env settings`: an env's settings change in place. Each change counts up its version,
-- which announcements carry, so a process that follows dlrover.control takes a version
-- newer than the one it runs and nothing older; the history keeps what was set.
ALTER TABLE envs ADD COLUMN settings_version integer NOT NULL DEFAULT 1;
ALTER TABLE env_changes ADD COLUMN settings jsonb;
