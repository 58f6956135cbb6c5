-- Closed, final sessions. Append-only except for backfill replacement and retention.
-- Partitioned by the UTC date of session_start.
CREATE TABLE IF NOT EXISTS delta.`${location}` (
  session_id      STRING    NOT NULL COMMENT 'Hash of user_id and session_start: the same on every replay or backfill',
  user_id         STRING    NOT NULL COMMENT 'Whose session this is',
  session_start   TIMESTAMP NOT NULL COMMENT 'First event time',
  session_end     TIMESTAMP NOT NULL COMMENT 'Last event time',
  duration_s      DOUBLE    NOT NULL COMMENT 'session_end - session_start, in seconds',
  event_count     BIGINT    NOT NULL COMMENT 'Events in the session',
  page_views      BIGINT    NOT NULL COMMENT 'Events that name a page',
  distinct_pages  INT       NOT NULL COMMENT 'Different pages seen',
  entry_page      STRING             COMMENT 'Page of the first event',
  exit_page       STRING             COMMENT 'Page of the last event',
  is_bounce       BOOLEAN   NOT NULL COMMENT 'A single-event session',
  gap_s           BIGINT    NOT NULL COMMENT 'Inactivity gap that delimited it, in seconds',
  closed_batch_id BIGINT    NOT NULL COMMENT 'Micro-batch that closed it (-1 for a backfill)',
  closed_at       TIMESTAMP NOT NULL COMMENT 'Processing time at which it closed',
  session_date    DATE      NOT NULL COMMENT 'UTC date of session_start (partition column)'
) USING DELTA
PARTITIONED BY (session_date)
TBLPROPERTIES (
  -- A log checkpoint every 100 commits (see events.sql).
  'delta.checkpointInterval' = '100',
  'delta.enableDeletionVectors' = 'true',
  -- File statistics only where they can skip files (see events.sql): times, batches,
  -- and user_id, which compaction clusters by.
  'delta.dataSkippingStatsColumns' = 'user_id,session_start,session_end,closed_batch_id,closed_at'
)
