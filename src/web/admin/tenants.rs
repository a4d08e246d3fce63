//! Tenants and their quotas.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use serde_json::json;
use tower_sessions::Session;

use crate::db::{self, tenants::Member, tenants::Tenant};
use crate::domain::{
    parse_name, IdleAction, IdlePolicy, Priority, Quota, QuotaField, QuotaInput, Slug,
};
use crate::web::auth::Admin;
use crate::web::error::AppError;
use crate::web::forms::{Field, FieldErrors};
use crate::web::pages::{flash, PageCtx};
use crate::web::AppState;

// ---------------------------------------------------------------- tenants

#[derive(Template, WebTemplate)]
#[template(path = "admin/tenants.html")]
pub struct TenantsPage {
    ctx: PageCtx,
    tenants: Vec<Tenant>,
}

pub async fn tenants(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
) -> Result<TenantsPage, AppError> {
    Ok(TenantsPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        tenants: db::tenants::list(&state.pool).await?,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/tenant_form.html")]
pub struct TenantFormPage {
    ctx: PageCtx,
    tenant: Option<Tenant>,
    slug: String,
    name: String,
    fields: Vec<Field>,
    errors: FieldErrors,
    members: Vec<Member>,
}

#[derive(Debug, Deserialize)]
pub struct TenantForm {
    #[serde(default)]
    slug: String,
    #[serde(default)]
    name: String,
    #[serde(flatten)]
    quota: QuotaInput,
    #[serde(flatten)]
    idle: IdleInput,
}

/// The idle-reclaim inputs of the tenant form, as typed.
#[derive(Debug, Default, Deserialize)]
pub struct IdleInput {
    #[serde(default)]
    idle_after_minutes: String,
    #[serde(default)]
    idle_grace_minutes: String,
    #[serde(default)]
    idle_action: String,
}

impl From<&IdlePolicy> for IdleInput {
    fn from(p: &IdlePolicy) -> Self {
        IdleInput {
            idle_after_minutes: p.after_minutes.to_string(),
            idle_grace_minutes: p.grace_minutes.to_string(),
            idle_action: p.action.as_str().to_string(),
        }
    }
}

/// Every input of the tenant form: the quota's, then idle reclaim's.
fn tenant_fields(q: &QuotaInput, idle: &IdleInput, errors: &FieldErrors) -> Vec<Field> {
    let mut fields = quota_fields(q, errors);
    let f = |name: &'static str, label, hint, value: &str, kind, min, max| Field {
        name,
        label,
        hint,
        value: value.to_string(),
        error: errors.get(name).cloned(),
        kind,
        options: Vec::new(),
        min,
        max,
    };
    fields.push(f(
        "idle_after_minutes",
        "Idle after (minutes)",
        "no work on a booking's GPU this long: warn its owner; 0 turns idle reclaim off",
        &idle.idle_after_minutes,
        "number",
        "0",
        "10080",
    ));
    fields.push(f(
        "idle_grace_minutes",
        "Idle grace (minutes)",
        "time the owner has to answer \"still working\" before the action",
        &idle.idle_grace_minutes,
        "number",
        "1",
        "10080",
    ));
    fields.push(Field {
        options: IdleAction::ALL.iter().map(|a| a.as_str()).collect(),
        ..f(
            "idle_action",
            "Idle action",
            "after the grace: notify only, or release the booking",
            &idle.idle_action,
            "select",
            "",
            "",
        )
    });
    fields
}

/// The quota inputs of the tenant form, in order, with their messages.
fn quota_fields(q: &QuotaInput, errors: &FieldErrors) -> Vec<Field> {
    let f = |name: QuotaField, label, hint, value: &str, min, max| Field {
        name: name.name(),
        label,
        hint,
        value: value.to_string(),
        error: errors.get(name.name()).cloned(),
        kind: "number",
        options: Vec::new(),
        min,
        max,
    };
    vec![
        f(
            QuotaField::MaxActiveBookings,
            "Active bookings",
            "bookings live at the same time",
            &q.max_active_bookings,
            "0",
            "1000",
        ),
        f(
            QuotaField::MaxGpuMemoryGib,
            "GPU memory (GiB)",
            "booked at the same time",
            &q.max_gpu_memory_gib,
            "0",
            "100000",
        ),
        f(
            QuotaField::MaxComputeSlices,
            "Compute slices",
            "at the same time; a whole GPU has 7",
            &q.max_compute_slices,
            "0",
            "10000",
        ),
        f(
            QuotaField::MonthlySliceHours,
            "Monthly slice-hours",
            "budget; 1 slice for 1 hour = 1",
            &q.monthly_slice_hours,
            "0",
            "10000000",
        ),
        f(
            QuotaField::MaxBookingHours,
            "Longest booking (hours)",
            "1 to 2160",
            &q.max_booking_hours,
            "1",
            "2160",
        ),
        f(
            QuotaField::GuaranteedSharePct,
            "Guaranteed share (%)",
            "QoS floor for time-sliced shares",
            &q.guaranteed_share_pct,
            "0",
            "100",
        ),
        Field {
            kind: "select",
            options: Priority::ALL.iter().map(|p| p.as_str()).collect(),
            ..f(
                QuotaField::DefaultPriority,
                "Default priority",
                "for time-sliced shares",
                &q.default_priority,
                "",
                "",
            )
        },
        Field {
            kind: "text",
            ..f(
                QuotaField::AllowedModels,
                "Allowed GPU models",
                "comma-separated; empty allows all",
                &q.allowed_models,
                "",
                "",
            )
        },
        Field {
            kind: "text",
            ..f(
                QuotaField::AllowedProfiles,
                "Allowed MIG profiles",
                "comma-separated; empty allows all",
                &q.allowed_profiles,
                "",
                "",
            )
        },
    ]
}

pub async fn new_tenant(session: Session, Admin(user): Admin) -> Result<TenantFormPage, AppError> {
    let errors = FieldErrors::default();
    Ok(TenantFormPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        tenant: None,
        slug: String::new(),
        name: String::new(),
        fields: tenant_fields(
            &QuotaInput::from(&Quota::default()),
            &IdleInput::from(&IdlePolicy::default()),
            &errors,
        ),
        errors,
        members: Vec::new(),
    })
}

fn parse_tenant_form(
    form: &TenantForm,
    creating: bool,
    idle_now: IdlePolicy,
) -> Result<(Option<Slug>, String, Quota, IdlePolicy), FieldErrors> {
    let mut errors = FieldErrors::default();
    let slug = if creating {
        match Slug::parse(&form.slug) {
            Ok(s) => Some(s),
            Err(e) => {
                errors.add("slug", e);
                None
            }
        }
    } else {
        None
    };
    let name = parse_name(&form.name, "name").unwrap_or_else(|e| {
        errors.add("name", e);
        String::new()
    });
    let quota = form.quota.parse().unwrap_or_else(|errs| {
        for (field, msg) in errs {
            errors.add(field.name(), msg);
        }
        Quota::default()
    });
    let idle = IdlePolicy::parse(
        idle_now,
        &form.idle.idle_after_minutes,
        &form.idle.idle_grace_minutes,
        &form.idle.idle_action,
    )
    .unwrap_or_else(|errs| {
        for (field, msg) in errs {
            errors.add(field, msg);
        }
        idle_now
    });
    if errors.is_empty() {
        Ok((slug, name, quota, idle))
    } else {
        Err(errors)
    }
}

pub async fn create_tenant(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Form(form): Form<TenantForm>,
) -> Result<Response, AppError> {
    let rerender = |errors: FieldErrors| async {
        let page = TenantFormPage {
            ctx: PageCtx::new(&session, Some(&user)).await?,
            tenant: None,
            slug: form.slug.trim().to_string(),
            name: form.name.trim().to_string(),
            fields: tenant_fields(&form.quota, &form.idle, &errors),
            errors,
            members: Vec::new(),
        };
        Ok::<_, AppError>((StatusCode::UNPROCESSABLE_ENTITY, page).into_response())
    };
    let (slug, name, quota, idle) = match parse_tenant_form(&form, true, IdlePolicy::default()) {
        Ok(v) => v,
        Err(errors) => return rerender(errors).await,
    };
    let Some(slug) = slug else {
        return Err(AppError::BadRequest("missing slug".into()));
    };
    let mut tx = state.pool.begin().await?;
    let id = match db::tenants::insert(&mut *tx, &slug, &name, &quota).await {
        Ok(id) => id,
        Err(e) if db::is_unique_violation(&e, "tenants_slug_key") => {
            let mut errors = FieldErrors::default();
            errors.add("slug", format!("the slug \"{slug}\" is taken"));
            return rerender(errors).await;
        }
        Err(e) => return Err(e.into()),
    };
    db::tenants::set_idle_policy(&mut tx, id, &idle).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "tenant.created",
        slug.as_str(),
        json!({"name": name, "quota": quota, "idle": idle}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, format!("Tenant {name} created.")).await?;
    Ok(Redirect::to(&format!("/admin/tenants/{id}")).into_response())
}

pub async fn edit_tenant(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<TenantFormPage, AppError> {
    let tenant = db::tenants::get(&state.pool, id).await?;
    let members = db::tenants::members(&state.pool, id).await?;
    let idle = db::tenants::idle_policy(&state.pool, id).await?;
    let errors = FieldErrors::default();
    Ok(TenantFormPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        slug: tenant.slug.clone(),
        name: tenant.name.clone(),
        fields: tenant_fields(
            &QuotaInput::from(&tenant.quota),
            &IdleInput::from(&idle),
            &errors,
        ),
        errors,
        tenant: Some(tenant),
        members,
    })
}

pub async fn update_tenant(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
    Form(form): Form<TenantForm>,
) -> Result<Response, AppError> {
    let tenant = db::tenants::get(&state.pool, id).await?;
    let idle_before = db::tenants::idle_policy(&state.pool, id).await?;
    let (_, name, quota, idle) = match parse_tenant_form(&form, false, idle_before) {
        Ok(v) => v,
        Err(errors) => {
            let members = db::tenants::members(&state.pool, id).await?;
            let page = TenantFormPage {
                ctx: PageCtx::new(&session, Some(&user)).await?,
                slug: tenant.slug.clone(),
                name: form.name.trim().to_string(),
                fields: tenant_fields(&form.quota, &form.idle, &errors),
                errors,
                tenant: Some(tenant),
                members,
            };
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
        }
    };
    // The same row lock a booking's quota check takes: an edit never
    // interleaves with a check.
    let mut tx = state.pool.begin().await?;
    let before = db::tenants::get_for_update(&mut tx, id).await?;
    db::tenants::update(&mut tx, id, &name, &quota).await?;
    db::tenants::set_idle_policy(&mut tx, id, &idle).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "tenant.updated",
        &before.slug,
        json!({"before": {"name": before.name, "quota": before.quota, "idle": idle_before},
               "after": {"name": name, "quota": quota, "idle": idle}}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, format!("Tenant {name} saved.")).await?;
    Ok(Redirect::to(&format!("/admin/tenants/{id}")).into_response())
}

async fn set_tenant_archived(
    state: &AppState,
    session: &Session,
    Admin(user): &Admin,
    id: i64,
    archived: bool,
) -> Result<Response, AppError> {
    let tenant = db::tenants::get(&state.pool, id).await?;
    let mut tx = state.pool.begin().await?;
    db::tenants::set_archived(&mut *tx, id, archived).await?;
    let action = if archived {
        "tenant.archived"
    } else {
        "tenant.restored"
    };
    db::audit::record(&mut *tx, &user.actor(), action, &tenant.slug, json!({})).await?;
    tx.commit().await?;
    let verb = if archived { "archived" } else { "restored" };
    flash(session, format!("Tenant {} {verb}.", tenant.name)).await?;
    Ok(Redirect::to(&format!("/admin/tenants/{id}")).into_response())
}

pub async fn archive_tenant(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_tenant_archived(&state, &session, &Admin(user), id, true).await
}

pub async fn restore_tenant(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_tenant_archived(&state, &session, &Admin(user), id, false).await
}
