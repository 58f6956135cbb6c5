-- description: How long closed sessions last, in buckets from 0 s to over 1 h, with their share.
WITH bucketed AS (
  SELECT CASE WHEN duration_s = 0    THEN 0
              WHEN duration_s <= 10  THEN 1
              WHEN duration_s <= 60  THEN 2
              WHEN duration_s <= 180 THEN 3
              WHEN duration_s <= 600 THEN 4
              WHEN duration_s <= 1800 THEN 5
              WHEN duration_s <= 3600 THEN 6
              ELSE 7 END AS bucket
  FROM sessions
)
SELECT bucket,
       element_at(array('0 s', '1-10 s', '11-60 s', '1-3 min', '3-10 min', '10-30 min',
                        '30-60 min', 'over 1 h'), bucket + 1)   AS duration,
       count(*)                                                  AS sessions,
       round(100 * count(*) / sum(count(*)) OVER (), 1)          AS share_pct
FROM bucketed
GROUP BY bucket
ORDER BY bucket
