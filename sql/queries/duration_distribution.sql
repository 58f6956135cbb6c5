-- description: How long closed sessions last, in the report's classes from 0 s to 2 h+, with their share.
-- The classes are those of `sessionlake report` (sessionlake.report.DURATION_CLASSES):
-- each upper bound is exclusive, so a 60-second session is in "1-5 min".
WITH bucketed AS (
  SELECT CASE WHEN duration_s = 0    THEN 0
              WHEN duration_s < 10   THEN 1
              WHEN duration_s < 60   THEN 2
              WHEN duration_s < 300  THEN 3
              WHEN duration_s < 900  THEN 4
              WHEN duration_s < 1800 THEN 5
              WHEN duration_s < 3600 THEN 6
              WHEN duration_s < 7200 THEN 7
              ELSE 8 END AS bucket
  FROM sessions
)
SELECT bucket,
       element_at(array('0 s', '<10 s', '10-60 s', '1-5 min', '5-15 min', '15-30 min',
                        '30-60 min', '1-2 h', '2 h+'), bucket + 1)   AS duration,
       count(*)                                                       AS sessions,
       round(100 * count(*) / sum(count(*)) OVER (), 1)               AS share_pct
FROM bucketed
GROUP BY bucket
ORDER BY bucket
