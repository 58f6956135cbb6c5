-- description: Engaged sessions per day (GA4): longer than 10 s, or 2+ page views, or a conversion event.
-- param: conversion_event string purchase -- the event_type that counts as a conversion
WITH converted AS (
  SELECT DISTINCT s.session_id
  FROM sessions s
  CROSS JOIN query_params p
  JOIN events e
    ON e.user_id = s.user_id
   AND e.event_time BETWEEN s.session_start AND s.session_end
   AND e.event_date BETWEEN s.session_date AND to_date(s.session_end)
  WHERE e.event_type = p.conversion_event
)
SELECT s.session_date,
       count(*)                                                   AS sessions,
       count_if(s.duration_s > 10 OR s.page_views >= 2 OR c.session_id IS NOT NULL)
                                                                  AS engaged_sessions,
       round(100 * count_if(s.duration_s > 10 OR s.page_views >= 2
                            OR c.session_id IS NOT NULL) / count(*), 1) AS engagement_rate_pct
FROM sessions s
LEFT JOIN converted c ON c.session_id = s.session_id
GROUP BY s.session_date
ORDER BY s.session_date
