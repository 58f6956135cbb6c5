-- description: How many events closed sessions have (1, 2, 3, 4-5, 6-10, 11-20, 21+), with their share.
WITH bucketed AS (
  SELECT CASE WHEN event_count <= 3  THEN CAST(event_count - 1 AS INT)
              WHEN event_count <= 5  THEN 3
              WHEN event_count <= 10 THEN 4
              WHEN event_count <= 20 THEN 5
              ELSE 6 END AS bucket
  FROM sessions
)
SELECT bucket,
       element_at(array('1', '2', '3', '4-5', '6-10', '11-20', '21+'), bucket + 1) AS events,
       count(*)                                                 AS sessions,
       round(100 * count(*) / sum(count(*)) OVER (), 1)         AS share_pct
FROM bucketed
GROUP BY bucket
ORDER BY bucket
