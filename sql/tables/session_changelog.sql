-- One row per change to a session per micro-batch: the audit trail and downstream feed.
-- change is open, extend, merge, split or close; a session opened and closed by one batch has
-- both an open and a close row. previous_session_ids lists the ids a merge or a re-keying
-- replaced, or the open session a split divided (split: an event that starts a long run
-- earlier moves its max-duration cuts, and an open session across a new cut is divided).
CREATE TABLE IF NOT EXISTS delta.`${location}` (
  batch_id             BIGINT    NOT NULL COMMENT 'Micro-batch of the change (-1 for a backfill)',
  change               STRING    NOT NULL COMMENT 'open | extend | merge | split | close | backfill',
  session_id           STRING    NOT NULL COMMENT 'The session after the change',
  user_id              STRING    NOT NULL COMMENT 'Whose session',
  session_start        TIMESTAMP NOT NULL COMMENT 'After the change',
  session_end          TIMESTAMP NOT NULL COMMENT 'After the change',
  event_count          BIGINT    NOT NULL COMMENT 'After the change',
  added_events         BIGINT    NOT NULL COMMENT 'Events this batch added to it',
  previous_session_ids ARRAY<STRING>      COMMENT 'Open sessions this one replaced (merge, or a new start)',
  changed_at           TIMESTAMP NOT NULL COMMENT 'Processing time of the batch'
) USING DELTA
TBLPROPERTIES (
  -- A log checkpoint every 100 commits (see events.sql).
  'delta.checkpointInterval' = '100',
  'delta.enableDeletionVectors' = 'true',
  -- File statistics only where they can skip files (see events.sql): batches, times,
  -- and user_id, which compaction clusters by.
  'delta.dataSkippingStatsColumns' = 'batch_id,user_id,session_start,session_end,changed_at'
)
