-- description: Pages that closed sessions end on, with their sessions.
SELECT exit_page,
       count(*) AS sessions
FROM sessions
WHERE exit_page IS NOT NULL
GROUP BY exit_page
ORDER BY sessions DESC, exit_page
