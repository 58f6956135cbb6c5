-- description: Closed sessions per day (UTC): sessions, users, events, average duration, bounce rate.
-- param: from_date date 0001-01-01 -- first session date
-- param: to_date date 9999-12-31 -- last session date
SELECT session_date,
       count(*)                                      AS sessions,
       count(DISTINCT user_id)                       AS users,
       sum(event_count)                              AS events,
       round(avg(duration_s), 1)                     AS avg_duration_s,
       round(100 * avg(CAST(is_bounce AS INT)), 1)   AS bounce_rate_pct
FROM sessions
CROSS JOIN query_params p
WHERE session_date BETWEEN p.from_date AND p.to_date
GROUP BY session_date
ORDER BY session_date
