//! Sign-in throttling: failures counted per key in a fixed window, kept in
//! PostgreSQL so that every web server behind a load balancer sees the same
//! counts.

use sqlx::PgExecutor;

/// Seconds until `key` may try again, if it is over `limit` failures in the
/// current window of `window_secs`.
pub async fn blocked_for(
    db: impl PgExecutor<'_>,
    key: &str,
    limit: i32,
    window_secs: i32,
) -> sqlx::Result<Option<i64>> {
    let row = sqlx::query!(
        r#"SELECT failures,
                  CEIL(EXTRACT(EPOCH FROM (window_start + make_interval(secs => $2) - now())))::bigint AS "left!"
           FROM login_throttle WHERE key = $1"#,
        key,
        f64::from(window_secs)
    )
    .fetch_optional(db)
    .await?;
    Ok(row.and_then(|r| (r.failures >= limit && r.left > 0).then_some(r.left)))
}

/// Counts one failure for `key`, opening a new window when the last one is over.
pub async fn record_failure(
    db: impl PgExecutor<'_>,
    key: &str,
    window_secs: i32,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO login_throttle (key, failures, window_start) VALUES ($1, 1, now())
         ON CONFLICT (key) DO UPDATE SET
           failures = CASE WHEN login_throttle.window_start + make_interval(secs => $2) < now()
                           THEN 1 ELSE login_throttle.failures + 1 END,
           window_start = CASE WHEN login_throttle.window_start + make_interval(secs => $2) < now()
                           THEN now() ELSE login_throttle.window_start END",
        key,
        f64::from(window_secs)
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Forgets the failures of `key` (after a successful sign-in).
pub async fn clear(db: impl PgExecutor<'_>, key: &str) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM login_throttle WHERE key = $1", key)
        .execute(db)
        .await?;
    Ok(())
}
