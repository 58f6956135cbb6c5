-- description: Two-step funnel: closed sessions that viewed page step1, and of those, step2 later in the same session.
-- param: step1 string / -- the first page of the funnel
-- param: step2 string /checkout -- the page that completes it
-- "Later" is the sessions' own order of events: by time, then, between events of the same
-- instant, by id with its final number compared as a number (part-7.log#7 before #15).
WITH steps AS (
  SELECT s.session_id,
         min(CASE WHEN e.page = p.step1 THEN e.event_order END) AS first_step1,
         max(CASE WHEN e.page = p.step2 THEN e.event_order END) AS last_step2
  FROM sessions s
  CROSS JOIN query_params p
  JOIN (SELECT *,
               named_struct('time', event_time,
                            'text', trim(TRAILING '0123456789' FROM event_id),
                            'digits', length(event_id)
                                      - length(trim(TRAILING '0123456789' FROM event_id)),
                            'id', event_id) AS event_order
        FROM events) e
    ON e.user_id = s.user_id
   AND e.event_time BETWEEN s.session_start AND s.session_end
   AND e.event_date BETWEEN s.session_date AND to_date(s.session_end)
  WHERE e.page IN (p.step1, p.step2)
  GROUP BY s.session_id
)
SELECT count_if(first_step1 IS NOT NULL)                               AS step1_sessions,
       count_if(first_step1 IS NOT NULL AND last_step2 > first_step1) AS step2_sessions,
       round(100 * count_if(first_step1 IS NOT NULL AND last_step2 > first_step1)
             / nullif(count_if(first_step1 IS NOT NULL), 0), 1)       AS conversion_pct
FROM steps
