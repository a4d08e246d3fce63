//! Calendar feeds: a person's and a tenant's bookings as RFC 5545 at a
//! secret URL, parsed by an independent parser (Python's `icalendar`);
//! renewing or revoking the URL makes the old one answer 404; only
//! managers get a tenant's feed.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{SimNode, TestApp};
use gpuslice::booking;

const FLEET: &str = r#"
[[node]]
name = "c1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 1
"#;

fn python() -> Option<String> {
    let p = std::env::var("GPUSLICE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&p)
        .args(["-c", "import icalendar"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Some(p)
    } else {
        common::skipped(
            "calendar feed parsing",
            "no python3 with the icalendar package (scripts/test.sh installs it)",
        );
        None
    }
}

/// The events of an iCalendar text, as an independent parser reads them:
/// `(uid, status, dtstart, dtend, summary)` lines.
fn parse(python: &str, ics: &str) -> Vec<String> {
    let script = r#"
import sys, icalendar
cal = icalendar.Calendar.from_ical(sys.stdin.read())
for ev in cal.walk("VEVENT"):
    s, e = ev.decoded("DTSTART"), ev.decoded("DTEND")
    assert s.tzinfo is not None and s.utcoffset().total_seconds() == 0, s
    print("|".join([str(ev["UID"]), str(ev.get("STATUS", "")), s.isoformat(), e.isoformat(), str(ev["SUMMARY"])]))
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(ics.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}\n{ics}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

async fn book(app: &TestApp, who: &booking::Requester, profile: &str) -> i64 {
    common::book(app, who, "mig", profile, 2).await.id
}

/// `GET /api/v1/calendar` with an API token: the feed's address.
async fn api_url(app: &TestApp, token: &str, query: &str) -> reqwest::Response {
    app.client()
        .get(app.url(&format!("/api/v1/calendar{query}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

async fn url_of(app: &TestApp, token: &str) -> String {
    let r = api_url(app, token, "").await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    v["url"].as_str().unwrap().to_string()
}

/// The path of a feed URL (the test server's host may differ).
fn path_of(url: &str) -> String {
    let i = url.find("/calendar/").unwrap();
    url[i..].to_string()
}

#[tokio::test]
async fn feeds_are_valid_icalendar_and_their_urls_can_be_renewed_and_revoked() {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    sqlx::query("UPDATE tenants SET max_active_bookings = 10, max_gpu_memory_gib = 200, max_compute_slices = 20")
        .execute(&app.pool)
        .await
        .unwrap();
    app.user("ana@uni.edu", "none", &["lab"]).await;
    app.user("pi@uni.edu", "none", &["lab:manager"]).await;
    SimNode::register(&app, FLEET, "c1", 4).await;
    let ana = common::member(&app, "ana@uni.edu", "lab").await;
    let kept = book(&app, &ana, "1g.10gb").await;
    let cancelled = book(&app, &ana, "2g.20gb").await;
    booking::release(&app.pool, &ana, cancelled, None, None)
        .await
        .unwrap();

    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "cal")
        .await
        .unwrap();
    let url = url_of(&app, &token).await;
    assert!(url.starts_with("http://") && url.ends_with(".ics"), "{url}");
    // Asked again: the same address.
    assert_eq!(url_of(&app, &token).await, url);

    // The feed needs no session.
    let feed = reqwest::get(app.url(&path_of(&url))).await.unwrap();
    assert_eq!(feed.status(), 200);
    assert!(feed.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/calendar"));
    let ics = feed.text().await.unwrap();
    assert!(
        ics.contains("BEGIN:VCALENDAR") && ics.contains("VERSION:2.0"),
        "{ics}"
    );
    if let Some(py) = python() {
        let events = parse(&py, &ics);
        assert_eq!(events.len(), 2, "{events:?}");
        let kept_line = events
            .iter()
            .find(|e| e.starts_with(&format!("booking-{kept}@gpuslice|")))
            .unwrap();
        assert!(kept_line.contains("|CONFIRMED|"), "{kept_line}");
        assert!(
            kept_line.contains("MIG 1g.10gb on H100-80GB"),
            "{kept_line}"
        );
        assert!(kept_line.contains("+00:00"), "times in UTC: {kept_line}");
        let cancelled_line = events
            .iter()
            .find(|e| e.starts_with(&format!("booking-{cancelled}@gpuslice|")))
            .unwrap();
        assert!(cancelled_line.contains("|CANCELLED|"), "{cancelled_line}");
        // Stable UIDs across fetches.
        let second = reqwest::get(app.url(&path_of(&url)))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let uids = |evs: &[String]| {
            let mut u: Vec<String> = evs
                .iter()
                .map(|e| e.split('|').next().unwrap().to_string())
                .collect();
            u.sort();
            u
        };
        assert_eq!(uids(&events), uids(&parse(&py, &second)));
    }

    // A new address on the settings page: the old one is gone.
    let web = app.signed_in("ana@uni.edu").await;
    let page = web
        .get(app.url("/settings/calendar"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&path_of(&url)), "{page}");
    let r = app
        .post_form(&web, "/settings/calendar", "/settings/calendar/renew", &[])
        .await;
    assert!(r.status().is_success() || r.status().is_redirection());
    assert_eq!(
        reqwest::get(app.url(&path_of(&url)))
            .await
            .unwrap()
            .status(),
        404
    );
    let renewed = url_of(&app, &token).await;
    assert_ne!(renewed, url);
    assert_eq!(
        reqwest::get(app.url(&path_of(&renewed)))
            .await
            .unwrap()
            .status(),
        200
    );
    // A guessed or malformed address is 404 (a NUL is refused at the edge).
    for bad in ["/calendar/nope.ics", "/calendar/x", "/calendar/a%20b.ics"] {
        assert_eq!(
            reqwest::get(app.url(bad)).await.unwrap().status(),
            404,
            "{bad}"
        );
    }
    assert_eq!(
        reqwest::get(app.url("/calendar/%00.ics"))
            .await
            .unwrap()
            .status(),
        400
    );

    // A tenant's feed: managers only.
    let r = api_url(&app, &token, "?tenant=lab").await;
    assert_eq!(r.status(), 404, "a member is not a manager");
    let pi = app.signed_in("pi@uni.edu").await;
    let r = app
        .post_form(
            &pi,
            "/settings/calendar",
            "/settings/calendar/renew",
            &[("tenant", "lab")],
        )
        .await;
    assert!(r.status().is_success() || r.status().is_redirection());
    let page = pi
        .get(app.url("/settings/calendar"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let tenant_url = page
        .split("class=\"feed-url\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap()
        .to_string();
    let ics = reqwest::get(app.url(&path_of(&tenant_url)))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(ics.contains(&format!("booking-{kept}@gpuslice")), "{ics}");
    let r = app
        .post_form(
            &pi,
            "/settings/calendar",
            "/settings/calendar/revoke",
            &[("tenant", "lab")],
        )
        .await;
    assert!(r.status().is_success() || r.status().is_redirection());
    assert_eq!(
        reqwest::get(app.url(&path_of(&tenant_url)))
            .await
            .unwrap()
            .status(),
        404
    );
    // Someone else's tenant cannot be asked for through the form either.
    let r = app
        .post_form(
            &web,
            "/settings/calendar",
            "/settings/calendar/renew",
            &[("tenant", "lab")],
        )
        .await;
    assert_eq!(r.status(), 404);
}
