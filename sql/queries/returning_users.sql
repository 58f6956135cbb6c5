-- description: New vs returning users per day: new on the day of their first closed session.
WITH first_seen AS (
  SELECT user_id, min(session_date) AS first_date FROM sessions GROUP BY user_id
), daily AS (
  SELECT DISTINCT s.session_date, s.user_id, f.first_date
  FROM sessions s JOIN first_seen f USING (user_id)
)
SELECT session_date,
       count_if(first_date = session_date) AS new_users,
       count_if(first_date < session_date) AS returning_users
FROM daily
GROUP BY session_date
ORDER BY session_date
