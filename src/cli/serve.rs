//! `gpuslice serve` and `gpuslice demo`.

use anyhow::{anyhow, bail, Context, Result};
use sqlx::PgPool;

use super::admin::{tenant_add, user_add};
use super::args::{ServeArgs, TenantAddArgs, UserAddArgs};
use crate::db;
use crate::domain::Email;
use crate::web::{self, AppState, WebSettings};

/// Serves the web application (and, unless `--no-worker`, the local
/// node's worker) until SIGTERM or Ctrl-C.
pub async fn serve(pool: PgPool, args: &ServeArgs, data_dir: &std::path::Path) -> Result<()> {
    let shutdown = super::shutdown_signal();
    if args.session_idle_minutes < 1 || args.session_max_hours < 1 {
        bail!("session lifetimes must be at least one minute (idle) and one hour (absolute)");
    }
    let currency = args.currency.trim().to_uppercase();
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_uppercase()) {
        bail!("--currency: give a three-letter ISO 4217 code such as EUR or USD");
    }
    let public_url = match args
        .public_url
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty())
    {
        Some(u) => {
            let ok = (u.starts_with("https://") || u.starts_with("http://"))
                && !u.contains(['?', '#', ' '])
                && u.len() <= 200;
            if !ok {
                bail!("GPUSLICE_PUBLIC_URL: give the site's address such as https://gpus.uni.edu");
            }
            Some(u.trim_end_matches('/').to_string())
        }
        None => None,
    };
    let settings = WebSettings {
        secure_cookies: args.secure_cookies,
        trust_proxy: args.trust_proxy,
        trusted_proxies: args.trusted_proxies.clone(),
        request_timeout: std::time::Duration::from_secs(args.request_timeout_secs),
        max_concurrent_requests: args.max_concurrent_requests as usize,
        session_idle_secs: args.session_idle_minutes * 60,
        session_absolute_secs: args.session_max_hours * 3600,
        public_url,
        ..WebSettings::default()
    };
    let sso = crate::web::sso::Sso::from_args(&args.sso)?;
    // Every setting is checked above and the address is taken before any
    // worker starts: a mistake starts nothing.
    let listener = tokio::net::TcpListener::bind(&args.bind)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (set GPUSLICE_BIND to another address)",
                args.bind
            )
        })?;
    let mut workers = super::node::start_watch(&pool, &args.gpu)?;
    if !args.no_worker {
        workers.extend(super::start_workers(&pool, &args.gpu, data_dir, None)?);
    }
    let mut settings = settings;
    if settings.public_url.is_none() {
        // From the address served on; an unspecified one (0.0.0.0) by the
        // host's name.
        let local = listener.local_addr()?;
        let host = if local.ip().is_unspecified() {
            format!(
                "{}:{}",
                nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_else(|| "localhost".into()),
                local.port()
            )
        } else {
            local.to_string()
        };
        let scheme = if settings.secure_cookies {
            "https"
        } else {
            "http"
        };
        settings.public_url = Some(format!("{scheme}://{host}"));
        tracing::info!(url = %settings.public_url.as_deref().unwrap_or(""), "links in e-mails use this address; set GPUSLICE_PUBLIC_URL to change it");
    }
    let mut state = AppState::new(pool, settings).await?;
    state.currency = std::sync::Arc::from(currency.as_str());
    state.sso = std::sync::Arc::new(sso);
    state.metrics_token = args
        .metrics_token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(std::sync::Arc::from);
    state.telemetry_interval_secs = args.gpu.telemetry_interval_secs;
    let loopback = listener.local_addr()?.ip().is_loopback();
    state.metrics_attribution = state.metrics_token.is_some() || loopback;
    if !state.metrics_attribution {
        tracing::warn!("/metrics is open on a network address: its series carry no tenant or booking labels; set GPUSLICE_METRICS_TOKEN to get them");
    }
    state.booking_settings = std::sync::Arc::new(crate::booking::Settings {
        max_ahead_days: args.max_ahead_days,
        ..Default::default()
    });
    tracing::info!(addr = %listener.local_addr()?, "gpuslice is serving");
    let served = web::serve(listener, state, shutdown).await;
    for w in workers {
        w.abort();
    }
    served
}

/// The password of every demo account (shown by `gpuslice demo`).
pub const DEMO_PASSWORD: &str = "try gpuslice on a laptop";

/// Demo accounts: (e-mail, name, role, tenants).
pub const DEMO_USERS: [(&str, &str, &str, &[&str]); 5] = [
    ("admin@demo.gpuslice.dev", "Ada Admin", "admin", &[]),
    ("finance@demo.gpuslice.dev", "Fin Ance", "finance", &[]),
    (
        "pi@demo.gpuslice.dev",
        "Grace Hopper (PI)",
        "none",
        &["vision-lab:manager", "nlp-group"],
    ),
    (
        "student@demo.gpuslice.dev",
        "Sam Student",
        "none",
        &["vision-lab", "cs-101"],
    ),
    (
        "ta@demo.gpuslice.dev",
        "Tara TA",
        "none",
        &["cs-101:manager"],
    ),
];

/// Creates the demo tenants and users unless they exist (idempotent).
pub async fn seed_demo(pool: &PgPool) -> Result<()> {
    let tenants: [(&str, &str, [&str; 5]); 3] = [
        (
            "vision-lab",
            "Computer Vision Lab",
            ["4", "160", "14", "2000", "72"],
        ),
        ("nlp-group", "NLP Group", ["3", "80", "7", "1000", "48"]),
        (
            "cs-101",
            "CS-101 Deep Learning (course)",
            ["1", "10", "1", "200", "4"],
        ),
    ];
    for (slug, name, [active, mem, slices, hours, longest]) in tenants {
        if db::tenants::id_by_slug(pool, slug).await?.is_some() {
            continue;
        }
        let args = TenantAddArgs {
            slug: slug.into(),
            name: name.into(),
            max_active_bookings: Some(active.into()),
            max_gpu_memory_gib: Some(mem.into()),
            max_compute_slices: Some(slices.into()),
            monthly_slice_hours: Some(hours.into()),
            max_booking_hours: Some(longest.into()),
            priority: None,
            guaranteed_share_pct: Some("20".into()),
            // The course gives idle GPUs back fast, to show idle reclaim:
            // warned after 10 idle minutes, released 5 minutes later.
            idle: if slug == "cs-101" {
                super::args::IdleArgs {
                    idle_after_minutes: Some("10".into()),
                    idle_grace_minutes: Some("5".into()),
                    idle_action: Some("release".into()),
                }
            } else {
                Default::default()
            },
        };
        tenant_add(pool, &args).await?;
    }
    for (email, name, role, tenants) in DEMO_USERS {
        if db::users::id_by_email(pool, &Email::parse(email).map_err(|e| anyhow!(e))?)
            .await?
            .is_some()
        {
            continue;
        }
        let args = UserAddArgs {
            email: email.into(),
            name: Some(name.into()),
            role: role.into(),
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
        };
        user_add(pool, &args, DEMO_PASSWORD).await?;
    }
    Ok(())
}

pub fn print_demo(bind: &str) {
    println!();
    println!("gpuslice demo: open http://{bind}/ and sign in with one of these accounts.");
    println!("Every demo account's password is: {DEMO_PASSWORD}");
    println!();
    for (email, name, role, tenants) in DEMO_USERS {
        let mut what: Vec<String> = Vec::new();
        if role != "none" {
            what.push(role.to_string());
        }
        for t in tenants {
            what.push(match t.split_once(':') {
                Some((slug, r)) => format!("{r} of {slug}"),
                None => format!("member of {t}"),
            });
        }
        let what = what.join(", ");
        println!("  {email:<28} {name:<20} {what}");
    }
    println!();
}
