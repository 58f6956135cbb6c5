-- One row per retention run: what it deleted, where, and whether time travel still reaches
-- it. Erased users are kept only as SHA-256 hashes of their ids: enough to prove (and, after
-- a restore, to re-apply) an erasure without storing the id that was erased.
CREATE TABLE IF NOT EXISTS delta.`${location}` (
  run_id                 STRING    NOT NULL COMMENT 'Id of the retention run',
  started_at             TIMESTAMP NOT NULL COMMENT 'When it started',
  finished_at            TIMESTAMP NOT NULL COMMENT 'When its last step finished',
  erased_users           INT       NOT NULL COMMENT 'How many user ids were asked to be erased',
  erased_user_sha256     ARRAY<STRING>      COMMENT 'SHA-256 (hex) of each erased user id',
  sessions_cutoff        DATE               COMMENT 'Sessions that started before it were deleted',
  events_cutoff          DATE               COMMENT 'Events before it were deleted',
  rows_deleted           MAP<STRING, BIGINT> COMMENT 'Rows deleted per table',
  versions_before        MAP<STRING, BIGINT> COMMENT 'Table versions before the run',
  versions_after         MAP<STRING, BIGINT> COMMENT 'Table versions after the run',
  vacuum_retain_hours    DOUBLE             COMMENT 'Retention VACUUM used (NULL: no VACUUM)',
  vacuum_requested_hours DOUBLE             COMMENT 'What the operator asked for',
  files_vacuumed         BIGINT    NOT NULL COMMENT 'Files VACUUM deleted, all tables',
  time_travel_purged     BOOLEAN   NOT NULL COMMENT 'No older version can show what was deleted',
  note                   STRING             COMMENT 'Why VACUUM kept more, and until when'
) USING DELTA
