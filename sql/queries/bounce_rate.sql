-- description: Bounce rate per day: closed sessions with a single event, out of all closed sessions.
SELECT session_date,
       count(*)                                     AS sessions,
       count_if(is_bounce)                          AS bounces,
       round(100 * count_if(is_bounce) / count(*), 1) AS bounce_rate_pct
FROM sessions
GROUP BY session_date
ORDER BY session_date
