//! Sign-in throttling: attempts counted per key in a fixed window, kept in
//! PostgreSQL so that every web server behind a load balancer sees the same
//! counts. An attempt is counted before the password is checked, in one
//! statement, so parallel attempts cannot slip past the limit; a successful
//! sign-in takes its own attempt back.

use sqlx::PgExecutor;

/// Counts one attempt for `key` (opening a new window when the last one is
/// over) and returns the attempts in the current window, this one included,
/// with the seconds the window has left.
pub async fn hit(db: impl PgExecutor<'_>, key: &str, window_secs: i32) -> sqlx::Result<(i32, i64)> {
    let row = sqlx::query!(
        r#"INSERT INTO login_throttle AS t (key, failures, window_start) VALUES ($1, 1, now())
           ON CONFLICT (key) DO UPDATE SET
             failures = CASE WHEN t.window_start + make_interval(secs => $2) < now()
                             THEN 1 ELSE t.failures + 1 END,
             window_start = CASE WHEN t.window_start + make_interval(secs => $2) < now()
                             THEN now() ELSE t.window_start END
           RETURNING failures,
             CEIL(EXTRACT(EPOCH FROM (window_start + make_interval(secs => $2) - now())))::bigint AS "left!""#,
        key,
        f64::from(window_secs)
    )
    .fetch_one(db)
    .await?;
    Ok((row.failures, row.left.max(1)))
}

/// Takes one counted attempt of `key` back (it was the owner's, and right).
pub async fn forgive(db: impl PgExecutor<'_>, key: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE login_throttle SET failures = greatest(failures - 1, 0) WHERE key = $1",
        key
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Forgets the attempts of `key` (after a successful sign-in).
pub async fn clear(db: impl PgExecutor<'_>, key: &str) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM login_throttle WHERE key = $1", key)
        .execute(db)
        .await?;
    Ok(())
}

/// Whether `user_id` has signed in successfully from `addr` in the last 90 days.
pub async fn known_address(
    db: impl PgExecutor<'_>,
    user_id: i64,
    addr: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM sign_in_addresses
                          WHERE user_id = $1 AND client_addr = $2
                            AND last_at > now() - interval '90 days') AS "known!""#,
        user_id,
        addr
    )
    .fetch_one(db)
    .await
}

/// Remembers that `user_id` signed in from `addr`.
pub async fn remember_address(
    db: impl PgExecutor<'_>,
    user_id: i64,
    addr: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO sign_in_addresses (user_id, client_addr) VALUES ($1, left($2, 64))
         ON CONFLICT (user_id, client_addr) DO UPDATE SET last_at = now()",
        user_id,
        addr
    )
    .execute(db)
    .await?;
    Ok(())
}
