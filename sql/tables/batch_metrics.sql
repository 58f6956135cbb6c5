-- One row per micro-batch: what came in, where it went, the state's size, and what the
-- state MERGE touched. max_event_time is cumulative: the watermark is max(max_event_time)
-- minus grace, which survives restarts because it lives here.
CREATE TABLE IF NOT EXISTS delta.`${location}` (
  batch_id              BIGINT    NOT NULL COMMENT 'Spark micro-batch id',
  stream_id             STRING    NOT NULL COMMENT 'Identity of the checkpoint that ran it',
  started_at            TIMESTAMP NOT NULL COMMENT 'Processing time at the batch start',
  finished_at           TIMESTAMP NOT NULL COMMENT 'Wall time when its last write committed',
  duration_ms           BIGINT    NOT NULL COMMENT 'finished_at - started_at',
  input_records         BIGINT    NOT NULL COMMENT 'Non-blank lines read',
  accepted              BIGINT    NOT NULL COMMENT 'Events added to sessions (and to events)',
  late                  BIGINT    NOT NULL COMMENT 'Events written to late_events',
  quarantined           BIGINT    NOT NULL COMMENT 'Records written to quarantine',
  duplicates            BIGINT    NOT NULL COMMENT 'Repeated event ids, counted once',
  sessions_opened       BIGINT    NOT NULL COMMENT 'Sessions this batch started',
  closed_sessions       BIGINT    NOT NULL COMMENT 'Sessions this batch closed (appended to sessions)',
  open_sessions         BIGINT    NOT NULL COMMENT 'Rows in open_sessions after the batch',
  max_event_time        TIMESTAMP          COMMENT 'Largest accepted event time so far, over all batches',
  watermark_before      TIMESTAMP          COMMENT 'W, the watermark the batch was judged against',
  watermark_after       TIMESTAMP          COMMENT 'Watermark after the batch',
  merge_rows_inserted   BIGINT    NOT NULL COMMENT 'open_sessions rows the MERGE inserted',
  merge_rows_updated    BIGINT    NOT NULL COMMENT 'open_sessions rows the MERGE updated',
  merge_rows_deleted    BIGINT    NOT NULL COMMENT 'open_sessions rows the MERGE deleted',
  merge_rows_copied     BIGINT    NOT NULL COMMENT 'Unchanged rows the MERGE rewrote (write amplification)',
  merge_files_added     BIGINT    NOT NULL COMMENT 'Files the MERGE wrote',
  merge_files_removed   BIGINT    NOT NULL COMMENT 'Files the MERGE removed',
  merge_duration_ms     BIGINT    NOT NULL COMMENT 'Time spent in the MERGE'
) USING DELTA
TBLPROPERTIES (
  -- A log checkpoint every 100 commits (see events.sql).
  'delta.checkpointInterval' = '100'
)
