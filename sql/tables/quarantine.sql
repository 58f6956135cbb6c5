-- Records that failed parsing or validation, kept with their raw text and the reason, so
-- that nothing is dropped silently and a fixed record can be replayed.
CREATE TABLE IF NOT EXISTS delta.`${location}` (
  raw             STRING    NOT NULL COMMENT 'The line as read (cut to 1 MiB, see raw_truncated)',
  raw_truncated   BOOLEAN   NOT NULL COMMENT 'Whether raw was cut',
  source_file     STRING    NOT NULL COMMENT 'File the record came from, relative to the source folder',
  source_line     BIGINT    NOT NULL COMMENT 'Line number, from 1',
  user_id         STRING             COMMENT 'The user, when it could be read (for erasure)',
  reason          STRING    NOT NULL COMMENT 'What is wrong with it',
  batch_id        BIGINT    NOT NULL COMMENT 'Micro-batch that read it',
  quarantined_at  TIMESTAMP NOT NULL COMMENT 'Processing time of that batch'
) USING DELTA
TBLPROPERTIES (
  -- A log checkpoint every 100 commits (see events.sql).
  'delta.checkpointInterval' = '100',
  'delta.enableDeletionVectors' = 'true',
  -- No statistics of the text or the user: Delta keeps each file's min and max (the
  -- first 32 characters of a string) in the table's log, where an erasure cannot reach
  -- them (an erased user's line stayed readable there); nothing filters on either.
  'delta.dataSkippingStatsColumns' = 'batch_id,quarantined_at,source_line'
)
