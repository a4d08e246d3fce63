//! Static assets (stylesheet, scripts, vendored htmx) embedded in the binary.
//! URLs carry a content hash, so responses can be cached for a year and a new
//! release still reaches every browser at once.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rust_embed::Embed;

#[derive(Embed)]
#[folder = "static/"]
struct Assets;

/// Versioned URLs of the assets the layout links.
pub struct AssetUrls {
    pub css: String,
    pub js: String,
    pub htmx: String,
}

fn etag(path: &str) -> Option<String> {
    Assets::get(path).map(|f| hex::encode(&f.metadata.sha256_hash()[..8]))
}

fn versioned(path: &str) -> String {
    format!("/static/{path}?v={}", etag(path).unwrap_or_default())
}

static URLS: LazyLock<AssetUrls> = LazyLock::new(|| AssetUrls {
    css: versioned("app.css"),
    js: versioned("app.js"),
    htmx: versioned("htmx.min.js"),
});

pub fn urls() -> &'static AssetUrls {
    &URLS
}

pub async fn serve(Path(path): Path<String>, headers: HeaderMap) -> Response {
    let Some(file) = Assets::get(&path) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let tag = format!("\"{}\"", hex::encode(&file.metadata.sha256_hash()[..8]));
    let cache = HeaderValue::from_static("public, max-age=31536000, immutable");
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == tag.as_bytes())
    {
        return (
            StatusCode::NOT_MODIFIED,
            [
                (header::ETAG, tag),
                (
                    header::CACHE_CONTROL,
                    cache.to_str().unwrap_or_default().to_string(),
                ),
            ],
        )
            .into_response();
    }
    let mime = file.metadata.mimetype().to_string();
    let content_type = if mime.starts_with("text/") || mime.contains("javascript") {
        format!("{mime}; charset=utf-8")
    } else {
        mime
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::ETAG, tag),
            (
                header::CACHE_CONTROL,
                cache.to_str().unwrap_or_default().to_string(),
            ),
        ],
        file.data.into_owned(),
    )
        .into_response()
}
