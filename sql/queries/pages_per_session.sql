-- description: Page views and distinct pages per closed session, per day.
SELECT session_date,
       count(*)                      AS sessions,
       round(avg(page_views), 2)     AS page_views_per_session,
       round(avg(distinct_pages), 2) AS distinct_pages_per_session
FROM sessions
GROUP BY session_date
ORDER BY session_date
