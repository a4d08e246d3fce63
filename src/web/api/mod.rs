//! The JSON API under `/api/v1`, authenticated by bearer token (or the
//! browser session). Every route is registered through utoipa's
//! [`OpenApiRouter`], which records its `#[utoipa::path]` description as
//! it adds the route: the OpenAPI document at `/api/v1/openapi.json` is
//! generated from the routes and the view structs, never kept by hand.
//! Errors are `{"error","message"}`, with `"fields"` for invalid input
//! (see `error.rs`).

mod account;
mod alerts;
mod availability;
mod bookings;
pub mod calendar;
mod usage;
pub mod views;

pub use bookings::input_from_json;

use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{InfoBuilder, OpenApi, ServerBuilder};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;

/// Where the API lives.
pub const BASE: &str = "/api/v1";

/// The API's routes with their descriptions, relative to [`BASE`].
fn documented() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(account::me))
        .routes(routes!(account::tenants))
        .routes(routes!(bookings::offerings))
        .routes(routes!(bookings::list, bookings::create))
        .routes(routes!(bookings::get))
        .routes(routes!(bookings::release))
        .routes(routes!(bookings::extend))
        .routes(routes!(bookings::keep))
        .routes(routes!(usage::usage))
        .routes(routes!(alerts::alerts))
        .routes(routes!(calendar::calendar))
        .routes(routes!(availability::availability))
}

/// The API router, to be nested at [`BASE`], with its OpenAPI document
/// at `/openapi.json`.
pub fn routes() -> Router<AppState> {
    let (router, doc) = documented().split_for_parts();
    let doc = Arc::new(tightened(described(doc)));
    router.route("/openapi.json", get(move || async move { Json(doc) }))
}

/// A tenant's slug, as [`crate::domain::Slug`] accepts it.
const SLUG_PATTERN: &str = "^[a-z0-9][a-z0-9-]{0,38}[a-z0-9]$";
/// A slug, or empty (the same as not given) in a query.
const SLUG_OR_EMPTY: &str = "^([a-z0-9][a-z0-9-]{0,38}[a-z0-9])?$";
/// The same, or `*` (every tenant: finance and admins, `GET /usage`).
const SLUG_OR_EMPTY_OR_ALL: &str = "^(\\*|[a-z0-9][a-z0-9-]{0,38}[a-z0-9])?$";
/// Free text: no control characters (PostgreSQL cannot store NUL).
const TEXT_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// The document with what the derives cannot say, so that a request the
/// document calls valid is one the API takes and every answer it can give
/// is listed: the value sets of query parameters and catalog names, the
/// body of a booking by kind (`oneOf`), and the answers every operation
/// may give (400 for a body or path that does not parse, 401, 429 while
/// throttled, 503 while busy or while the database is away).
fn tightened(doc: OpenApi) -> Value {
    let mut doc = serde_json::to_value(doc).expect("the OpenAPI document is JSON");
    let error = json!({"description": "", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}});
    let always = [
        (
            "400",
            "the request does not parse (JSON, path, NUL characters)",
        ),
        ("401", "no valid token or session"),
        ("429", "too many requests; see Retry-After"),
        (
            "503",
            "busy or the database is unreachable; see Retry-After",
        ),
    ];
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, ops) in paths.iter_mut() {
            let Some(ops) = ops.as_object_mut() else {
                continue;
            };
            for op in ops.values_mut() {
                let has_body = op.get("requestBody").is_some();
                let has_query = op
                    .get("parameters")
                    .and_then(Value::as_array)
                    .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
                if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
                    for (code, r) in responses.iter_mut() {
                        if r.get("description").is_none() {
                            let reason = code
                                .parse::<u16>()
                                .ok()
                                .and_then(|c| axum::http::StatusCode::from_u16(c).ok())
                                .and_then(|c| c.canonical_reason())
                                .unwrap_or("answer");
                            r["description"] = json!(reason);
                        }
                    }
                    let body_errors = [(
                        "415",
                        "the body is not JSON (Content-Type: application/json)",
                    )];
                    let input_errors = [("422", "invalid input, one message per field")];
                    let extra = if has_body { &body_errors[..] } else { &[] };
                    let input = if has_body || has_query {
                        &input_errors[..]
                    } else {
                        &[]
                    };
                    for (code, why) in always.iter().chain(extra).chain(input).copied() {
                        responses.entry(code).or_insert_with(|| {
                            let mut e = error.clone();
                            e["description"] = json!(why);
                            e
                        });
                    }
                }
                let params = op.get_mut("parameters").and_then(Value::as_array_mut);
                for param in params.into_iter().flatten() {
                    let schema = match (param["in"].as_str(), param["name"].as_str()) {
                        (Some("query"), Some(name)) => name,
                        (Some("path"), Some("id")) => "id",
                        (Some("header"), Some("Idempotency-Key")) => "Idempotency-Key",
                        _ => continue,
                    };
                    let schema = match schema {
                        "from" | "to" if path == "/availability" => {
                            param["required"] = json!(false);
                            json!({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "maxLength": 0}]})
                        }
                        "profile" if path == "/availability" => {
                            let mut profiles: Vec<&str> = crate::gpu::catalog::models()
                                .iter()
                                .flat_map(|m| m.profiles.iter().map(|p| p.name.as_str()))
                                .collect();
                            profiles.sort_unstable();
                            profiles.dedup();
                            profiles.push("");
                            json!({"type": "string", "enum": profiles})
                        }
                        "memory_gib" if path == "/availability" => {
                            json!({"type": "string", "pattern": "^([1-9][0-9]{0,2}|10[01][0-9]|102[0-4])?$"})
                        }
                        "model" if path == "/availability" => {
                            let mut models: Vec<&str> =
                                crate::gpu::catalog::models().iter().map(|m| m.id).collect();
                            models.extend(["any", ""]);
                            json!({"type": "string", "enum": models})
                        }
                        // `*`: every tenant (finance and admins).
                        "tenant" if path == "/usage" => {
                            json!({"type": "string", "pattern": SLUG_OR_EMPTY_OR_ALL})
                        }
                        // Empty is the same as not given.
                        "tenant" => json!({"type": "string", "pattern": SLUG_OR_EMPTY}),
                        // Blank or not given: the current month.
                        "from" | "to" => {
                            param["required"] = json!(false);
                            json!({"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "pattern": "^\\s*$"}]})
                        }
                        "scope" => {
                            json!({"type": "string", "enum": ["mine", "tenant", "all"]})
                        }
                        "state" => {
                            json!({"type": "string", "enum": ["firing", "resolved", "all"]})
                        }
                        "id" => json!({"type": "integer", "format": "int64", "minimum": 1}),
                        "cursor" => {
                            json!({"type": "string", "pattern": "^([01]\\.[0-9]{1,18}\\.[1-9][0-9]{0,17})?$"})
                        }
                        "limit" => {
                            json!({"type": "string", "pattern": "^([1-9]|[1-9][0-9]|[1-4][0-9]{2}|500)?$"})
                        }
                        "Idempotency-Key" => {
                            json!({"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[\\u0020-\\u007e]*$"})
                        }
                        _ => continue,
                    };
                    param["schema"] = schema;
                }
            }
        }
    }
    let schemas = &mut doc["components"]["schemas"];
    schemas["BookingBody"] = booking_body_schema();
    schemas["ExtendBody"] = json!({
        "type": "object", "required": ["hours"], "additionalProperties": false,
        "properties": {"hours": {"type": "integer", "minimum": 1, "maximum": crate::domain::booking::MAX_HOURS, "description": "Hours to add."}}
    });
    schemas["ReleaseBody"] = json!({
        "type": "object", "additionalProperties": false,
        "description": "A reason is needed to end someone else's booking. The body may be omitted or null.",
        "properties": {"reason": {"type": ["string", "null"], "maxLength": crate::booking::MAX_REASON_CHARS, "pattern": TEXT_PATTERN}}
    });
    doc
}

/// `POST /bookings`: a MIG instance (a profile of the catalog) or a
/// time-sliced share (GPU memory), by `kind`.
fn booking_body_schema() -> Value {
    use crate::gpu::catalog;
    let mut profiles: Vec<&str> = catalog::models()
        .iter()
        .flat_map(|m| m.profiles.iter().map(|p| p.name.as_str()))
        .collect();
    profiles.sort_unstable();
    profiles.dedup();
    let mut models: Vec<&str> = catalog::models().iter().map(|m| m.id).collect();
    models.push("any");
    let common = json!({
        "tenant": {"type": "string", "pattern": SLUG_PATTERN, "description": "Your tenant's slug."},
        "model": {"type": ["string", "null"], "enum": models.iter().map(|m| json!(m)).chain([Value::Null]).collect::<Vec<_>>(), "description": "A catalog model; omitted or any: any model."},
        "start": {"type": ["string", "null"], "format": "date-time", "description": "RFC 3339; omitted: now. It may not lie in the past nor beyond the booking horizon."},
        "hours": {"type": "integer", "minimum": 1, "maximum": crate::domain::booking::MAX_HOURS, "description": "At most the tenant's longest booking."},
    });
    let with = |extra: Value, required: &[&str]| {
        let mut props = common.clone();
        for (k, v) in extra.as_object().into_iter().flatten() {
            props[k] = v.clone();
        }
        json!({"type": "object", "additionalProperties": false, "required": required, "properties": props})
    };
    let with_example = |mut schema: Value, example: Value| {
        schema["examples"] = json!([example]);
        schema
    };
    json!({
        "description": "A new booking: a MIG instance (kind mig, a profile) or a time-sliced share (kind timeslice, GPU memory). Numbers may also be given as strings.",
        "oneOf": [
            with_example(with(json!({
                "kind": {"type": "string", "enum": ["mig"]},
                "profile": {"type": "string", "enum": profiles, "description": "A MIG profile of the model (of any model when none is given)."},
            }), &["tenant", "kind", "profile", "hours"]),
            json!({"tenant": "vision-lab", "kind": "mig", "model": "H100-80GB", "profile": "1g.10gb", "hours": 2})),
            with_example(with(json!({
                "kind": {"type": "string", "enum": ["timeslice"]},
                "memory_gib": {"type": "integer", "minimum": 1, "maximum": 1024, "description": "GPU memory of the share in GiB."},
                "priority": {"type": ["string", "null"], "enum": ["high", "normal", "low", "default", null], "description": "Omitted or default: the tenant's default."},
            }), &["tenant", "kind", "memory_gib", "hours"]),
            json!({"tenant": "vision-lab", "kind": "timeslice", "memory_gib": 8, "priority": "normal", "hours": 1})),
        ]
    })
}

/// The generated document with what the routes do not say: title,
/// version, server, authentication.
fn described(mut doc: OpenApi) -> OpenApi {
    doc.info = InfoBuilder::new()
        .title("gpuslice API")
        .version("1")
        .description(Some(
            "Book slices of NVIDIA GPUs. Authenticate with `Authorization: Bearer <token>`; \
             create tokens at /settings/tokens or with `gpuslice token create --email E`. \
             Errors are JSON {\"error\": code, \"message\": text}, with \"fields\" \
             (field -> message) when input is invalid (422).",
        ))
        .build();
    doc.servers = Some(vec![ServerBuilder::new().url(BASE).build()]);
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
    );
    doc.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
        "bearer",
        Vec::<String>::new(),
    )]);
    doc
}
