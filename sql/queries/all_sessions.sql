-- description: Every session, closed and still open, with a status column.
SELECT session_id, user_id, session_start, session_end,
       CAST(unix_micros(session_end) - unix_micros(session_start) AS DOUBLE) / 1e6 AS duration_s,
       event_count, page_views, entry_page, exit_page, 'closed' AS status
FROM sessions
UNION ALL
SELECT session_id, user_id, session_start, session_end,
       CAST(unix_micros(session_end) - unix_micros(session_start) AS DOUBLE) / 1e6 AS duration_s,
       event_count, page_views, entry_page, exit_page, 'open' AS status
FROM open_sessions
