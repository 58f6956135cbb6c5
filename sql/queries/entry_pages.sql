-- description: Pages that closed sessions start on, with their sessions and bounce rate.
SELECT entry_page,
       count(*)                                        AS sessions,
       round(100 * count_if(is_bounce) / count(*), 1)  AS bounce_rate_pct
FROM sessions
WHERE entry_page IS NOT NULL
GROUP BY entry_page
ORDER BY sessions DESC, entry_page
