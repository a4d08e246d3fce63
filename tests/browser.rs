//! A person in a real browser (headless Chromium through ChromeDriver):
//! signs in as admin, edits a tenant's quota, and sees it saved. Screenshots
//! land in `target/screenshots/` for people to look at.
//!
//! Without Chromium and ChromeDriver the test says loudly that it was
//! skipped; with `GPUSLICE_REQUIRE_BROWSER=1` (set by scripts/test.sh, so in
//! CI) it fails instead.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{TestApp, PASSWORD};
use fantoccini::{ClientBuilder, Locator};

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn browser() -> Option<(fantoccini::Client, Driver)> {
    let (Some(chromium), Some(chromedriver)) = (
        find(&["chromium", "chromium-browser", "google-chrome"]),
        find(&["chromedriver"]),
    ) else {
        let why = "Chromium and ChromeDriver are not installed (Debian: apt-get install chromium chromium-driver)";
        if std::env::var_os("GPUSLICE_REQUIRE_BROWSER").is_some() {
            panic!("browser test required but {why}");
        }
        common::skipped("browser test", why);
        return None;
    };
    let port = free_port();
    let driver = Driver(
        Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let profile =
        std::env::temp_dir().join(format!("gpuslice-chromium-{}-{port}", std::process::id()));
    let caps = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ],
            "prefs": {
                "download.default_directory": downloads().display().to_string(),
                "download.prompt_for_download": false,
            }
        }
    });
    let caps = caps.as_object().unwrap().clone();
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        let client = ClientBuilder::new(connector.clone())
            .capabilities(caps.clone())
            .connect(&url)
            .await;
        match client {
            Ok(c) => return Some((c, driver)),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("ChromeDriver did not accept a session on port {port}");
}

/// Where the browser saves downloads.
fn downloads() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-downloads");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(c: &fantoccini::Client, name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = c.screenshot().await.unwrap();
    std::fs::write(dir.join(name), png).unwrap();
}

#[tokio::test]
async fn admin_signs_in_and_edits_a_quota_in_a_browser() {
    let app = TestApp::spawn().await;
    let id = app.tenant("vision-lab").await;
    app.user("pi@uni.edu", "none", &["vision-lab:manager"])
        .await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let Some((c, _driver)) = browser().await else {
        return;
    };

    c.goto(&app.url("/")).await.unwrap();
    // Not signed in: the browser lands on the sign-in form.
    assert!(c.current_url().await.unwrap().path().starts_with("/login"));
    screenshot(&c, "login.png").await;
    c.find(Locator::Id("email"))
        .await
        .unwrap()
        .send_keys("admin@uni.edu")
        .await
        .unwrap();
    c.find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys(PASSWORD)
        .await
        .unwrap();
    c.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::LinkText("Tenants"))
        .await
        .unwrap();

    c.find(Locator::LinkText("Tenants"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::LinkText("Tenant vision-lab"))
        .await
        .unwrap();
    screenshot(&c, "admin-tenants.png").await;
    c.find(Locator::LinkText("Tenant vision-lab"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let field = c
        .wait()
        .for_element(Locator::Id("max_active_bookings"))
        .await
        .unwrap();
    field.clear().await.unwrap();
    field.send_keys("-3").await.unwrap();
    c.find(Locator::Css("form[novalidate] button.primary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // A bad value re-renders the form with its message.
    let msg = c
        .wait()
        .for_element(Locator::Css("#max_active_bookings-error"))
        .await
        .unwrap();
    assert_eq!(msg.text().await.unwrap(), "may not be negative");
    screenshot(&c, "admin-tenant-error.png").await;

    let field = c.find(Locator::Id("max_active_bookings")).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys("7").await.unwrap();
    c.find(Locator::Css("form[novalidate] button.primary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let flash = c.wait().for_element(Locator::Css(".flash")).await.unwrap();
    assert!(flash.text().await.unwrap().contains("saved"));
    let shown = c
        .find(Locator::Id("max_active_bookings"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap();
    assert_eq!(shown.as_deref(), Some("7"));
    screenshot(&c, "admin-tenant-saved.png").await;

    let stored: i32 = sqlx::query_scalar("SELECT max_active_bookings FROM tenants WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, 7);

    // Sorting a table works in the browser (app.js): click "Slug" twice.
    c.goto(&app.url("/admin/users")).await.unwrap();
    let th = c
        .wait()
        .for_element(Locator::XPath("//th[text()='E-mail']"))
        .await
        .unwrap();
    th.click().await.unwrap();
    th.click().await.unwrap();
    let first = c
        .find(Locator::Css("tbody tr td a"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(first, "pi@uni.edu", "descending by e-mail");
    screenshot(&c, "admin-users.png").await;

    // The fleet page draws the memory slices of a fragmented H100.
    let fleet = gpuslice::gpu::fleet::Fleet::demo();
    let node = std::sync::Arc::new(
        gpuslice::gpu::sim::SimBackend::open(&fleet, "gpu-node-1", None).unwrap(),
    );
    let h100 = gpuslice::gpu::GpuBackend::inventory(&*node).unwrap()[0]
        .uuid
        .clone();
    let at = |start, size| gpuslice::gpu::catalog::Placement { start, size };
    gpuslice::gpu::GpuBackend::create_instance(&*node, &h100, 19, at(2, 1)).unwrap();
    gpuslice::gpu::GpuBackend::create_instance(&*node, &h100, 9, at(4, 4)).unwrap();
    let backend: std::sync::Arc<dyn gpuslice::gpu::GpuBackend> = node.clone();
    gpuslice::worker::report_inventory(&app.pool, "gpu-node-1", backend, |_| 4)
        .await
        .unwrap();
    c.goto(&app.url("/admin/fleet")).await.unwrap();
    c.wait()
        .for_element(Locator::Css("svg.slots"))
        .await
        .unwrap();
    screenshot(&c, "admin-fleet.png").await;

    c.close().await.unwrap();
}

#[tokio::test]
async fn a_student_books_a_slice_watches_it_go_live_and_releases_it() {
    let app = TestApp::spawn().await;
    app.tenant("cs-101").await;
    app.user("student@uni.edu", "none", &["cs-101"]).await;
    // A worker for one simulated node, as `gpuslice serve` runs it.
    let fleet = gpuslice::gpu::fleet::Fleet::demo();
    let sim = common::SimNode::register_fleet(&app, &fleet, "gpu-node-1", 4).await;
    let (node, backend) = (sim.backend.clone(), sim.dyn_backend());
    let settings = gpuslice::worker::bookings::Settings {
        tick: Duration::from_millis(200),
        grace: Duration::from_millis(100),
        ..Default::default()
    };
    let worker = tokio::spawn(gpuslice::worker::bookings::run(
        app.pool.clone(),
        "gpu-node-1".into(),
        backend,
        settings,
    ));
    let Some((c, _driver)) = browser().await else {
        worker.abort();
        return;
    };

    c.goto(&app.url("/login")).await.unwrap();
    c.find(Locator::Id("email"))
        .await
        .unwrap()
        .send_keys("student@uni.edu")
        .await
        .unwrap();
    c.find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys(PASSWORD)
        .await
        .unwrap();
    c.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::LinkText("Book a slice"))
        .await
        .unwrap();
    screenshot(&c, "student-dashboard.png").await;
    c.find(Locator::LinkText("Book a slice"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let profile = c.wait().for_element(Locator::Id("profile")).await.unwrap();
    profile.select_by_value("1g.10gb").await.unwrap();
    c.find(Locator::Id("model"))
        .await
        .unwrap()
        .select_by_value("H100-80GB")
        .await
        .unwrap();
    // The availability panel follows the model (htmx).
    c.wait()
        .for_element(Locator::XPath(
            "//div[@id='availability']//td[text()='H100-80GB']",
        ))
        .await
        .unwrap();
    let hours = c.find(Locator::Id("hours")).await.unwrap();
    hours.clear().await.unwrap();
    hours.send_keys("2").await.unwrap();
    screenshot(&c, "student-book-form.png").await;
    c.find(Locator::Css("#booking-form button.primary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // The booking page turns active by itself (htmx polling), no reload.
    let device = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("code#device"))
        .await
        .unwrap();
    let uuid = device.text().await.unwrap();
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    let status = c
        .find(Locator::Id("status"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(status, "active");
    screenshot(&c, "student-booking-active.png").await;

    // Release: the confirm dialog is accepted, and the page shows the end.
    c.find(Locator::Id("release"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.accept_alert().await.unwrap();
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#status.status-released"))
        .await
        .unwrap();
    screenshot(&c, "student-booking-released.png").await;
    assert!(gpuslice::gpu::GpuBackend::inventory(&*node)
        .unwrap()
        .iter()
        .filter(|g| g.mig_current)
        .all(|g| gpuslice::gpu::GpuBackend::instances(&*node, &g.uuid)
            .unwrap()
            .is_empty()));
    c.close().await.unwrap();
    worker.abort();
}

#[tokio::test]
async fn finance_downloads_the_usage_csv_from_the_reports_page() {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    app.user("fin@uni.edu", "finance", &[]).await;
    let today = time::OffsetDateTime::now_utc().date();
    sqlx::query(
        "INSERT INTO bookings (tenant_id, user_id, kind, model, profile, memory_gib, compute_slices,
                               priority, hours, during, status)
         SELECT t.id, u.id, 'mig', 'H100-80GB', '3g.40gb', 40, 3, 'normal', 1,
                tstzrange(now() - interval '2 hours', now() - interval '1 hour'), 'failed'
         FROM tenants t, users u WHERE t.slug = 'lab' AND u.email = 'ana@uni.edu'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds)
         SELECT id, date_trunc('day', now()), date_trunc('day', now()) + interval '1 hour',
                3 * 3600, 40 * 3600 FROM bookings",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let Some((c, _driver)) = browser().await else {
        return;
    };
    let file = downloads().join(format!(
        "gpuslice-usage-{}-{today}.csv",
        today.replace_day(1).unwrap()
    ));
    let _ = std::fs::remove_file(&file);
    c.goto(&app.url("/login")).await.unwrap();
    c.find(Locator::Id("email"))
        .await
        .unwrap()
        .send_keys("fin@uni.edu")
        .await
        .unwrap();
    c.find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys(PASSWORD)
        .await
        .unwrap();
    c.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::LinkText("Reports"))
        .await
        .unwrap();
    c.find(Locator::LinkText("Reports"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait().for_element(Locator::Id("csv")).await.unwrap();
    screenshot(&c, "finance-reports.png").await;
    c.find(Locator::Id("csv"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let mut text = String::new();
    for _ in 0..100 {
        if let Ok(t) = std::fs::read_to_string(&file) {
            if t.ends_with("\r\n") {
                text = t;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        text.starts_with("date,tenant_slug,"),
        "downloaded {}: {text:?}",
        file.display()
    );
    assert!(text.contains(",ana@uni.edu,"), "{text}");
    assert!(
        text.contains(",3g.40gb,10800,3.0000,40.0000,,EUR"),
        "{text}"
    );
    c.close().await.unwrap();
}
