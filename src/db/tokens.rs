//! API tokens: only their SHA-256 is stored.

use sqlx::PgExecutor;
use time::OffsetDateTime;

#[derive(Debug, Clone)]
pub struct Token {
    pub id: i64,
    pub name: String,
    pub prefix: String,
    pub created_at: OffsetDateTime,
    pub last_used_at: Option<OffsetDateTime>,
    pub revoked_at: Option<OffsetDateTime>,
}

pub async fn insert(
    db: impl PgExecutor<'_>,
    user_id: i64,
    name: &str,
    hash: &str,
    prefix: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO api_tokens (user_id, name, token_hash, prefix) VALUES ($1, $2, $3, $4)
         RETURNING id",
        user_id,
        name,
        hash,
        prefix
    )
    .fetch_one(db)
    .await
}

pub async fn list_for_user(db: impl PgExecutor<'_>, user_id: i64) -> sqlx::Result<Vec<Token>> {
    sqlx::query_as!(
        Token,
        "SELECT id, name, prefix, created_at, last_used_at, revoked_at
         FROM api_tokens WHERE user_id = $1 ORDER BY revoked_at NULLS FIRST, created_at DESC",
        user_id
    )
    .fetch_all(db)
    .await
}

/// Revokes one of the user's own tokens; false when it is not theirs or
/// already revoked.
pub async fn revoke(db: impl PgExecutor<'_>, user_id: i64, id: i64) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE api_tokens SET revoked_at = now()
         WHERE id = $1 AND user_id = $2 AND revoked_at IS NULL",
        id,
        user_id
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The live token and the user it belongs to (disabled users' tokens do
/// not work), `(token id, user id, token name)`, noting the use.
pub async fn user_for_hash(
    db: impl PgExecutor<'_>,
    hash: &str,
) -> sqlx::Result<Option<(i64, i64, String)>> {
    let row = sqlx::query!(
        "UPDATE api_tokens t SET last_used_at = now()
         FROM users u
         WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND u.id = t.user_id AND NOT u.disabled
         RETURNING t.id, t.user_id, t.name",
        hash
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| (r.id, r.user_id, r.name)))
}
