-- The short report `make demo` prints: one row per day of closed sessions.
SELECT session_date,
       count(*)                                   AS sessions,
       count(DISTINCT user_id)                    AS users,
       round(avg(event_count), 1)                 AS events_per_session,
       round(avg(duration_s), 1)                  AS avg_duration_s,
       round(100 * avg(CAST(is_bounce AS INT)), 1) AS bounce_rate_pct
FROM sessions
GROUP BY session_date
ORDER BY session_date
