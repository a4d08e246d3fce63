//! The JSON API under `/api/v1`, authenticated by bearer token (or the
//! browser session). Every route is registered through utoipa's
//! [`OpenApiRouter`], which records its `#[utoipa::path]` description as
//! it adds the route: the OpenAPI document at `/api/v1/openapi.json` is
//! generated from the routes and the view structs, never kept by hand.
//! Errors are `{"error","message"}`, with `"fields"` for invalid input
//! (see `error.rs`).

mod account;
mod alerts;
mod bookings;
mod usage;
pub mod views;

use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
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
        .routes(routes!(usage::usage))
        .routes(routes!(alerts::alerts))
}

/// The API router, to be nested at [`BASE`], with its OpenAPI document
/// at `/openapi.json`.
pub fn routes() -> Router<AppState> {
    let (router, doc) = documented().split_for_parts();
    let doc = Arc::new(described(doc));
    router.route("/openapi.json", get(move || async move { Json(doc) }))
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
