//! `tenant add`, `user add`, `user link`, `token create`: the same
//! validation as the admin forms, audited as the command line.

use anyhow::{anyhow, bail, Result};
use serde_json::json;
use sqlx::PgPool;

use super::args::{IdleArgs, TenantAddArgs, TenantEditArgs, UserAddArgs};
use crate::db::{self, audit::Actor};
use crate::domain::{
    self, parse_membership_arg, parse_name, Email, GlobalRole, IdlePolicy, Password, Quota,
    QuotaInput, Slug,
};
use crate::web;

/// `user link`: the Unix account `gpuslice exec` accepts for a user.
pub async fn user_link(pool: &PgPool, email: &str, unix_user: &str) -> Result<()> {
    let email = Email::parse(email).map_err(|e| anyhow!("--email: {e}"))?;
    let value = domain::parse_unix_user(unix_user).map_err(|e| anyhow!("--unix-user: {e}"))?;
    let id = db::users::id_by_email(pool, &email)
        .await?
        .ok_or_else(|| anyhow!("--email: no user has the e-mail {email}"))?;
    db::users::set_unix_user(pool, id, value.as_deref()).await?;
    db::audit::record(
        pool,
        &Actor::cli(),
        "user.unix_user",
        email.as_str(),
        json!({ "unix_user": value }),
    )
    .await?;
    Ok(())
}

/// `tenant add`: the quota flags go through the same validation as the form.
pub async fn tenant_add(pool: &PgPool, args: &TenantAddArgs) -> Result<i64> {
    let slug = Slug::parse(&args.slug).map_err(|e| anyhow!("--slug: {e}"))?;
    let name = parse_name(&args.name, "name").map_err(|e| anyhow!("--name: {e}"))?;
    let mut input = QuotaInput::from(&Quota::default());
    let pick = |v: &Option<String>, default: &mut String| {
        if let Some(v) = v {
            *default = v.clone();
        }
    };
    pick(&args.max_active_bookings, &mut input.max_active_bookings);
    pick(&args.max_gpu_memory_gib, &mut input.max_gpu_memory_gib);
    pick(&args.max_compute_slices, &mut input.max_compute_slices);
    pick(&args.monthly_slice_hours, &mut input.monthly_slice_hours);
    pick(&args.max_booking_hours, &mut input.max_booking_hours);
    pick(&args.priority, &mut input.default_priority);
    pick(&args.guaranteed_share_pct, &mut input.guaranteed_share_pct);
    let quota = input.parse().map_err(|errs| {
        let (field, msg) = &errs[0];
        let flag = match field.name() {
            "default_priority" => "priority".to_string(),
            other => other.replace('_', "-"),
        };
        anyhow!("--{flag}: {msg}")
    })?;
    let idle = idle_from_flags(IdlePolicy::default(), &args.idle)?;
    let mut tx = pool.begin().await?;
    let id = match db::tenants::insert(&mut *tx, &slug, &name, &quota).await {
        Ok(id) => id,
        Err(e) if db::is_unique_violation(&e, "tenants_slug_key") => {
            bail!("a tenant with slug \"{slug}\" already exists")
        }
        Err(e) => return Err(e.into()),
    };
    db::audit::record(
        &mut *tx,
        &Actor::cli(),
        "tenant.created",
        slug.as_str(),
        json!({"name": name, "idle": idle}),
    )
    .await?;
    db::tenants::set_idle_policy(&mut tx, id, &idle).await?;
    tx.commit().await?;
    Ok(id)
}

/// The idle flags over `base`; the first bad flag as a sentence.
fn idle_from_flags(base: IdlePolicy, f: &IdleArgs) -> Result<IdlePolicy> {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    IdlePolicy::parse(
        base,
        &v(&f.idle_after_minutes),
        &v(&f.idle_grace_minutes),
        &v(&f.idle_action),
    )
    .map_err(|errs| {
        let (field, msg) = &errs[0];
        anyhow!("--{}: {msg}", field.replace('_', "-"))
    })
}

/// `tenant edit`: changes a tenant's idle policy (audited); returns it.
pub async fn tenant_edit(pool: &PgPool, args: &TenantEditArgs) -> Result<IdlePolicy> {
    let slug = Slug::parse(&args.slug).map_err(|e| anyhow!("--slug: {e}"))?;
    let id = db::tenants::id_by_slug(pool, slug.as_str())
        .await?
        .ok_or_else(|| anyhow!("there is no tenant \"{slug}\""))?;
    let before = db::tenants::idle_policy(pool, id).await?;
    let idle = idle_from_flags(before, &args.idle)?;
    let mut tx = pool.begin().await?;
    db::tenants::set_idle_policy(&mut tx, id, &idle).await?;
    db::audit::record(
        &mut *tx,
        &Actor::cli(),
        "tenant.updated",
        slug.as_str(),
        json!({"before": {"idle": before}, "after": {"idle": idle}}),
    )
    .await?;
    tx.commit().await?;
    Ok(idle)
}

/// `user add`: creates the user with their memberships in one transaction.
pub async fn user_add(pool: &PgPool, args: &UserAddArgs, password: &str) -> Result<i64> {
    let email = Email::parse(&args.email).map_err(|e| anyhow!("--email: {e}"))?;
    let name = match &args.name {
        Some(n) => parse_name(n, "name").map_err(|e| anyhow!("--name: {e}"))?,
        None => email
            .as_str()
            .split('@')
            .next()
            .unwrap_or("user")
            .to_string(),
    };
    let role = GlobalRole::parse(&args.role).map_err(|e| anyhow!("--role: {e}"))?;
    let memberships = args
        .tenants
        .iter()
        .map(|t| parse_membership_arg(t).map_err(|e| anyhow!("--tenant {t}: {e}")))
        .collect::<Result<Vec<_>>>()?;
    let password = Password::new(password, Some(email.as_str()))
        .map_err(|e| anyhow!("password from standard input: {e}"))?;
    let hash = tokio::task::spawn_blocking(move || domain::hash_password(&password)).await?;
    let mut tx = pool.begin().await?;
    let id = match db::users::insert(&mut *tx, &email, &name, &hash, role).await {
        Ok(id) => id,
        Err(e) if db::is_unique_violation(&e, "users_email_key") => {
            bail!("a user with e-mail {email} already exists")
        }
        Err(e) => return Err(e.into()),
    };
    for (slug, tenant_role) in &memberships {
        let tenant_id = db::tenants::id_by_slug(&mut *tx, slug.as_str())
            .await?
            .ok_or_else(|| anyhow!("--tenant: no tenant has the slug \"{slug}\""))?;
        db::users::set_membership(&mut *tx, id, tenant_id, *tenant_role).await?;
    }
    db::audit::record(
        &mut *tx,
        &Actor::cli(),
        "user.created",
        email.as_str(),
        json!({"global_role": role.as_str(),
               "tenants": memberships.iter().map(|(s, r)| format!("{s}:{}", r.as_str())).collect::<Vec<_>>()}),
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// `token create`: a new API token for the user, printed once.
pub async fn token_create(pool: &PgPool, email: &str, name: &str) -> Result<String> {
    let email = Email::parse(email).map_err(|e| anyhow!("--email: {e}"))?;
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 100 {
        bail!("--name: a token name has 1 to 100 characters");
    }
    let user_id = db::users::id_by_email(pool, &email)
        .await?
        .ok_or_else(|| anyhow!("no user has the e-mail address {email}"))?;
    let (token, hash, prefix) = web::auth::generate_token();
    let mut tx = pool.begin().await?;
    db::tokens::insert(&mut *tx, user_id, name, &hash, &prefix).await?;
    db::audit::record(
        &mut *tx,
        &Actor::cli(),
        "token.created",
        email.as_str(),
        json!({"name": name, "prefix": prefix}),
    )
    .await?;
    tx.commit().await?;
    Ok(token)
}
