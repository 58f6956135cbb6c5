-- description: Closed sessions by the hour (UTC) they started in.
SELECT date_trunc('HOUR', session_start)   AS hour,
       count(*)                            AS sessions,
       count(DISTINCT user_id)             AS users,
       round(avg(duration_s), 1)           AS avg_duration_s
FROM sessions
GROUP BY 1
ORDER BY 1
