-- Internal: what each micro-batch read, recorded before it writes anything, so that a batch
-- replayed after a crash reads the same table versions and clock and so writes the same rows.
CREATE TABLE IF NOT EXISTS delta.`${location}` (
  stream_id               STRING    NOT NULL COMMENT 'Identity of the checkpoint',
  epoch                   INT       NOT NULL COMMENT 'Incremented by every restore of the checkpoint',
  batch_id                BIGINT    NOT NULL COMMENT 'Spark micro-batch id',
  events_version          BIGINT    NOT NULL COMMENT 'Version of events read',
  open_sessions_version   BIGINT    NOT NULL COMMENT 'Version of open_sessions read',
  sessions_version        BIGINT    NOT NULL COMMENT 'Version of sessions read',
  max_event_time_before   TIMESTAMP          COMMENT 'Largest accepted event time before the batch',
  processing_time         TIMESTAMP NOT NULL COMMENT 'The batch clock'
) USING DELTA
