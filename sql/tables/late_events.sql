-- Events rejected as too late for their session, with the reason and the watermark they
-- were judged against.
CREATE TABLE IF NOT EXISTS delta.`${location}` (
  event_id     STRING    NOT NULL COMMENT 'As in events',
  user_id      STRING    NOT NULL COMMENT 'As in events',
  event_time   TIMESTAMP NOT NULL COMMENT 'As in events',
  event_type   STRING    NOT NULL COMMENT 'As in events',
  page         STRING             COMMENT 'As in events',
  properties   MAP<STRING, STRING> COMMENT 'As in events',
  source_file  STRING    NOT NULL COMMENT 'As in events',
  source_line  BIGINT    NOT NULL COMMENT 'As in events',
  reason       STRING    NOT NULL COMMENT 'Why it was too late',
  watermark    TIMESTAMP          COMMENT 'Watermark before the batch (W)',
  batch_id     BIGINT    NOT NULL COMMENT 'Micro-batch that rejected it',
  recorded_at  TIMESTAMP NOT NULL COMMENT 'Processing time of that batch'
) USING DELTA
TBLPROPERTIES (
  -- A log checkpoint every 100 commits (see events.sql).
  'delta.checkpointInterval' = '100',
  'delta.enableDeletionVectors' = 'true',
  -- No statistics of the user or the event's contents (see quarantine.sql): only of what
  -- a reader filters on, event_id among them (the duplicate check's bound, as in events).
  'delta.dataSkippingStatsColumns' = 'event_time,batch_id,recorded_at,event_id'
)
