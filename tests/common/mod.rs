//! The test harness: one PostgreSQL cluster for the whole run (the same
//! embedded cluster code gpuslice uses, under `target/test-pg`), a template
//! database migrated once, and a fresh database cloned from it for every
//! test. `TestApp::spawn` serves the real router on a free port.
#![allow(dead_code)]

use std::net::SocketAddr;

/// A test that needs what this machine lacks: fails when
/// `GPUSLICE_REQUIRE_CGROUPS` is set, else skips loudly (see [`skipped`]).
pub fn skip_or_require(what: &str, why: &str) {
    if std::env::var_os("GPUSLICE_REQUIRE_CGROUPS").is_some() {
        panic!("{what} required but {why}");
    }
    skipped(what, why);
}

/// Whether this process is root; when not, the test part `what` is
/// skipped (or required) with that reason.
pub fn require_root(what: &str) -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    if !root {
        skip_or_require(what, "not running as root");
    }
    root
}

/// A new booking of tenant `lab` made through the booking rules
/// (`kind` mig with `profile`, or timeslice with `memory_gib` 8, normal),
/// from now.
pub async fn book(
    app: &TestApp,
    who: &gpuslice::booking::Requester,
    kind: &str,
    profile: &str,
    hours: u32,
) -> gpuslice::db::bookings::Booking {
    book_from(app, who, kind, profile, hours, None).await
}

/// [`book`], from `start` when given.
pub async fn book_from(
    app: &TestApp,
    who: &gpuslice::booking::Requester,
    kind: &str,
    profile: &str,
    hours: u32,
    start: Option<time::OffsetDateTime>,
) -> gpuslice::db::bookings::Booking {
    use gpuslice::booking::{self, Created};
    let req = gpuslice::domain::booking::BookingInput {
        tenant: "lab".into(),
        kind: kind.into(),
        profile: profile.into(),
        memory_gib: if kind == "timeslice" {
            "8".into()
        } else {
            String::new()
        },
        priority: if kind == "timeslice" {
            "normal".into()
        } else {
            String::new()
        },
        hours: hours.to_string(),
        start: start
            .map(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .unwrap()
            })
            .unwrap_or_default(),
        ..Default::default()
    }
    .parse()
    .unwrap();
    match booking::create(&app.pool, who, &req, None, &Default::default())
        .await
        .unwrap()
    {
        Created::New(b) => b,
        Created::Replayed(_) => unreachable!(),
    }
}

/// A test database with tenant `lab` (room for ten bookings) and its
/// member `ana@uni.edu`, whose Unix account is `nobody`, and a real
/// `gpuslice worker` process for a node of one H100 in MIG mode (name
/// from `tag`; `envs` added to its environment), its GPU reported.
pub async fn mig_worker(
    tag: &str,
    envs: &[(&str, &str)],
) -> (TestApp, WorkerProcess, Killed, gpuslice::booking::Requester) {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    sqlx::query("UPDATE tenants SET max_active_bookings = 10, max_gpu_memory_gib = 200, max_compute_slices = 20")
        .execute(&app.pool)
        .await
        .unwrap();
    app.user("ana@uni.edu", "none", &["lab"]).await;
    gpuslice::cli::user_link(&app.pool, "ana@uni.edu", "nobody")
        .await
        .unwrap();
    let name = format!("m{}{tag}", std::process::id());
    let fleet = format!(
        "[[node]]\nname = \"{name}\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n"
    );
    let node = WorkerProcess::new(&app, tag, &name, &fleet);
    let mut cmd = node.command();
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let worker = Killed(cmd.spawn().unwrap());
    wait_for("the worker's GPU", || async {
        app.one::<i64>("SELECT count(*) FROM gpus").await == 1
    })
    .await;
    let who = member(&app, "ana@uni.edu", "lab").await;
    (app, node, worker, who)
}

/// As [`book`], then waits until the booking is active.
pub async fn book_active(
    app: &TestApp,
    who: &gpuslice::booking::Requester,
    kind: &str,
    profile: &str,
) -> i64 {
    let id = book(app, who, kind, profile, 1).await.id;
    wait_for("active", || async {
        booking_status(app, id).await == "active"
    })
    .await;
    id
}

/// Says loudly that a test (or part of one) could not run here, and why:
/// on standard error, and in the file `GPUSLICE_SKIP_LOG` names, which
/// `scripts/test.sh` prints and counts after the run (libtest hides the
/// output of passing tests).
pub fn skipped(what: &str, why: &str) {
    let line = format!("SKIPPED {what}: {why}");
    eprintln!("\n*** {line} ***\n");
    if let Some(path) = std::env::var_os("GPUSLICE_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}
use std::sync::OnceLock;

use gpuslice::db::{self, embedded::Cluster};
use gpuslice::web::{AppState, WebSettings};
use reqwest::{redirect, Client, StatusCode};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgPool};

pub const PASSWORD: &str = "a long and boring test password";

struct Shared {
    /// Options to reach the cluster's `postgres` maintenance database.
    admin: PgConnectOptions,
    template: String,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

fn template_name() -> String {
    // Named after the migrations' checksums: a changed migration makes a new
    // template instead of reusing a stale one.
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for m in db::MIGRATOR.iter() {
        h.update(m.version.to_le_bytes());
        h.update(&*m.checksum);
    }
    format!("tmpl_{}", &hex::encode(h.finalize())[..16])
}

fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        // Its own thread and runtime: the cluster outlives any one test's runtime.
        std::thread::spawn(|| {
            tokio::runtime::Runtime::new()
                .expect("runtime")
                .block_on(init_shared())
        })
        .join()
        .expect("test database set-up panicked")
    })
}

async fn init_shared() -> Shared {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-pg");
    let cluster = Cluster::ensure(&dir)
        .await
        .expect("cannot start the test PostgreSQL cluster");
    let admin = cluster.options_for("postgres");
    let template = template_name();
    let mut conn = admin.connect().await.expect("connect to test cluster");
    // Several test binaries may start at once: one builds the template.
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut conn)
        .await
        .unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&template)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    if !exists {
        let building = format!("{template}_building");
        sqlx::query(&format!("DROP DATABASE IF EXISTS {building}"))
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE {building}"))
            .execute(&mut conn)
            .await
            .unwrap();
        {
            let pool = db::connect(cluster.options_for(&building)).await.unwrap();
            db::migrate(&pool)
                .await
                .expect("migrations apply to a new database");
            pool.close().await;
        }
        sqlx::query(&format!("ALTER DATABASE {building} RENAME TO {template}"))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.ok();
    // The cluster keeps running for the other tests and binaries;
    // scripts/test.sh stops it at the end of the run.
    std::mem::forget(cluster);
    Shared { admin, template }
}

/// A fresh, migrated database for one test.
pub async fn fresh_db() -> (PgPool, PgConnectOptions, String) {
    let shared = shared();
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = shared
        .admin
        .connect()
        .await
        .expect("connect to test cluster");
    sqlx::query(&format!(
        "CREATE DATABASE {name} TEMPLATE {}",
        shared.template
    ))
    .execute(&mut conn)
    .await
    .expect("clone the template database");
    conn.close().await.ok();
    let options = shared.admin.clone().database(&name);
    let pool = db::connect(options.clone())
        .await
        .expect("connect to test database");
    (pool, options, name)
}

/// The socket folder and database name, as a URL for the CLI binary.
pub fn database_url(options: &PgConnectOptions, name: &str) -> String {
    let host = options
        .get_socket()
        .map(|p| p.to_string_lossy().to_string())
        .unwrap_or_default();
    let host: String = form_urlencoded::byte_serialize(host.as_bytes()).collect();
    format!("postgres://gpuslice@{host}/{name}")
}

/// The application, served on a free local port over a fresh database.
pub struct TestApp {
    pub addr: SocketAddr,
    pub pool: PgPool,
    pub options: PgConnectOptions,
    pub db_name: String,
    /// The state the server runs with (its semaphores, for the limit tests).
    #[allow(dead_code)]
    pub state: AppState,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(WebSettings::default()).await
    }

    pub async fn spawn_with(settings: WebSettings) -> TestApp {
        Self::spawn_configured(settings, |_| {}).await
    }

    /// A server whose state `configure` adjusts before it serves (single
    /// sign-on, booking limits).
    pub async fn spawn_configured(
        settings: WebSettings,
        configure: impl FnOnce(&mut AppState),
    ) -> TestApp {
        let (pool, options, db_name) = fresh_db().await;
        let mut state = AppState::new(pool.clone(), settings).await.unwrap();
        configure(&mut state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(gpuslice::web::serve(
            listener,
            state.clone(),
            std::future::pending(),
        ));
        TestApp {
            addr,
            pool,
            options,
            db_name,
            state,
        }
    }

    /// The single value a query without parameters returns.
    pub async fn one<T>(&self, sql: &str) -> T
    where
        T: Send + Unpin,
        (T,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A browser-like client: keeps cookies, does not follow redirects.
    pub fn client(&self) -> Client {
        Client::builder()
            .cookie_store(true)
            .redirect(redirect::Policy::none())
            .build()
            .unwrap()
    }

    /// Creates a user through the same code as `gpuslice user add`.
    pub async fn user(&self, email: &str, role: &str, tenants: &[&str]) -> i64 {
        let args = gpuslice::cli::UserAddArgs {
            email: email.into(),
            name: None,
            role: role.into(),
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
        };
        gpuslice::cli::user_add(&self.pool, &args, PASSWORD)
            .await
            .unwrap()
    }

    pub async fn tenant(&self, slug: &str) -> i64 {
        let args = gpuslice::cli::TenantAddArgs {
            slug: slug.into(),
            name: format!("Tenant {slug}"),
            max_active_bookings: None,
            max_gpu_memory_gib: None,
            max_compute_slices: None,
            monthly_slice_hours: None,
            max_booking_hours: None,
            priority: None,
            guaranteed_share_pct: None,
            idle: Default::default(),
        };
        gpuslice::cli::tenant_add(&self.pool, &args).await.unwrap()
    }

    /// The CSRF token a page hands out to this client.
    pub async fn csrf(&self, client: &Client, path: &str) -> String {
        let body = client
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        extract_csrf(&body).unwrap_or_else(|| panic!("no CSRF token on {path}"))
    }

    /// Signs in; returns the response to the sign-in POST.
    pub async fn login_as(
        &self,
        client: &Client,
        email: &str,
        password: &str,
    ) -> reqwest::Response {
        let token = self.csrf(client, "/login").await;
        self.post_login(client, &token, email, password).await
    }

    /// Posts the sign-in form with `token` as its CSRF token.
    pub async fn post_login(
        &self,
        client: &Client,
        token: &str,
        email: &str,
        password: &str,
    ) -> reqwest::Response {
        client
            .post(self.url("/login"))
            .form(&[
                ("csrf_token", token),
                ("email", email),
                ("password", password),
            ])
            .send()
            .await
            .unwrap()
    }

    /// A client signed in as `email`.
    pub async fn signed_in(&self, email: &str) -> Client {
        let c = self.client();
        let r = self.login_as(&c, email, PASSWORD).await;
        assert_eq!(
            r.status(),
            StatusCode::SEE_OTHER,
            "sign-in as {email} failed"
        );
        c
    }

    /// The body of `path` as `client` gets it.
    pub async fn text(&self, client: &Client, path: &str) -> String {
        client
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// POSTs a form with the client's CSRF token (taken from `page`).
    pub async fn post_form(
        &self,
        client: &Client,
        page: &str,
        path: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Response {
        let token = self.csrf(client, page).await;
        let mut all = vec![("csrf_token", token.as_str())];
        all.extend_from_slice(fields);
        client.post(self.url(path)).form(&all).send().await.unwrap()
    }
}

pub fn extract_csrf(body: &str) -> Option<String> {
    let marker = "name=\"csrf_token\" value=\"";
    let start = body.find(marker)? + marker.len();
    let end = body[start..].find('"')? + start;
    Some(body[start..end].to_string())
}

/// Builds the stand-in `libnvidia-ml.so` (once per test binary) and returns
/// a private copy of it: each copy loads separately, so it starts from clean
/// "hardware".
pub fn standin_copy() -> std::path::PathBuf {
    static LIB: OnceLock<std::path::PathBuf> = OnceLock::new();
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let lib = LIB.get_or_init(|| {
        remove_stale_copies();
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "nvml-standin"])
            .current_dir(&root)
            .status()
            .expect("run cargo to build the stand-in libnvidia-ml");
        assert!(status.success(), "the stand-in libnvidia-ml did not build");
        root.join("target/debug/libnvidia_ml.so")
    });
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let copy = std::env::temp_dir().join(format!(
        "gpuslice-libnvidia-ml-{}-{n}.so",
        std::process::id()
    ));
    std::fs::copy(lib, &copy).unwrap();
    copy
}

/// Removes the stand-in copies of test processes that have ended (each is
/// tens of MB, and a test binary makes dozens; a copy must outlive its
/// test's workers, so it cannot go when the test does).
fn remove_stale_copies() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("gpuslice-libnvidia-ml-"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Polls `f` every 100 ms until it holds; panics naming `what` after 30 s.
pub async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A booking's status.
pub async fn booking_status(app: &TestApp, id: i64) -> String {
    sqlx::query_scalar("SELECT status FROM bookings WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// A child process killed when the test ends, even by a panic.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- A simulated GPU node in the test process ------------------------------

/// One node of a simulated fleet driven from the test: its backend, its
/// inventory reports and single passes of its booking worker.
pub struct SimNode {
    pub name: String,
    pub backend: std::sync::Arc<gpuslice::gpu::sim::SimBackend>,
}

impl SimNode {
    /// Opens node `name` of `fleet` (TOML) in memory and reports its GPUs
    /// (`max_shares` each) to the app's database.
    pub async fn register(app: &TestApp, fleet: &str, name: &str, max_shares: i32) -> SimNode {
        let fleet = gpuslice::gpu::fleet::Fleet::parse(fleet).unwrap();
        SimNode::register_fleet(app, &fleet, name, max_shares).await
    }

    /// As [`SimNode::register`], for a parsed fleet.
    pub async fn register_fleet(
        app: &TestApp,
        fleet: &gpuslice::gpu::fleet::Fleet,
        name: &str,
        max_shares: i32,
    ) -> SimNode {
        let backend =
            std::sync::Arc::new(gpuslice::gpu::sim::SimBackend::open(fleet, name, None).unwrap());
        let node = SimNode {
            name: name.to_string(),
            backend,
        };
        node.report(app, max_shares).await;
        node
    }

    /// The backend as the worker sees it.
    pub fn dyn_backend(&self) -> std::sync::Arc<dyn gpuslice::gpu::GpuBackend> {
        self.backend.clone()
    }

    /// One inventory report.
    pub async fn report(&self, app: &TestApp, max_shares: i32) {
        gpuslice::worker::report_inventory(&app.pool, &self.name, self.dyn_backend(), move |_| {
            max_shares
        })
        .await
        .unwrap();
    }

    /// One pass of the node's booking worker (grace period 100 ms).
    pub async fn step(&self, app: &TestApp) -> usize {
        let settings = gpuslice::worker::bookings::Settings {
            grace: std::time::Duration::from_millis(100),
            ..Default::default()
        };
        gpuslice::worker::bookings::step(
            &app.pool,
            &self.name,
            &format!("{}/test", self.name),
            self.dyn_backend(),
            &settings,
        )
        .await
        .unwrap()
    }
}

// ---- A worker process ------------------------------------------------------

/// `gpuslice worker --node NAME` as a child process on a simulated fleet
/// of its own (a fleet file and data directory under the temp folder,
/// removed on drop), against the test's database.
pub struct WorkerProcess {
    pub name: String,
    pub dir: std::path::PathBuf,
    pub url: String,
}

impl WorkerProcess {
    /// A node named `name` with `fleet_toml` as its fleet file, in a folder
    /// keyed by `tag` and the test's database.
    pub fn new(app: &TestApp, tag: &str, name: &str, fleet_toml: &str) -> WorkerProcess {
        let dir = std::env::temp_dir().join(format!(
            "gpuslice-{tag}-{}-{}",
            std::process::id(),
            app.db_name
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("fleet.toml"), fleet_toml).unwrap();
        WorkerProcess {
            name: name.to_string(),
            url: database_url(&app.options, &app.db_name),
            dir,
        }
    }

    /// The command that starts the worker (fast ticks, logs at warn);
    /// callers add their own settings before spawning.
    pub fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpuslice"));
        cmd.args(["worker", "--node", &self.name])
            .env("DATABASE_URL", &self.url)
            .env("GPUSLICE_DATA_DIR", &self.dir)
            .env("GPUSLICE_FLEET", self.dir.join("fleet.toml"))
            .env("GPUSLICE_BACKEND", "sim")
            .env("GPUSLICE_WORKER_TICK_MS", "100")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null());
        cmd
    }

    /// Runs `gpuslice ARGS` against this node's database, data directory
    /// and fleet (simulated backend).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(args)
            .env("DATABASE_URL", &self.url)
            .env("GPUSLICE_DATA_DIR", &self.dir)
            .env("GPUSLICE_FLEET", self.dir.join("fleet.toml"))
            .env("GPUSLICE_BACKEND", "sim")
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    /// The `gpuslice exec` socket.
    pub fn socket(&self) -> std::path::PathBuf {
        self.dir.join("exec.sock")
    }

    /// The simulated hardware's state file, as JSON (`Null` before the
    /// worker wrote it).
    pub fn hardware(&self) -> serde_json::Value {
        let path = self.dir.join(format!("sim/sim-{}.json", self.name));
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The booking rules' view of a plain member of one tenant.
pub async fn member(app: &TestApp, email: &str, tenant: &str) -> gpuslice::booking::Requester {
    let user_id: i64 = sqlx::query_scalar("SELECT id FROM users WHERE email = $1")
        .bind(email)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let tenant_id: i64 = sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1")
        .bind(tenant)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    gpuslice::booking::Requester {
        user_id,
        email: email.to_string(),
        is_admin: false,
        is_finance: false,
        tenants: vec![(tenant_id, tenant.to_string(), false)],
    }
}

// ---- The stand-in libcuda and the launch shim ------------------------------

/// Builds the stand-in `libcuda.so` / `libcuda.so.1`, `cuda-burn` and the
/// launch shim (once per test binary) and returns the folder they are in.
pub fn cuda_parts() -> std::path::PathBuf {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "cuda-standin",
                "-p",
                "gpuslice-shim",
            ])
            .current_dir(&root)
            .status()
            .expect("run cargo to build the stand-in libcuda and the shim");
        assert!(
            status.success(),
            "the stand-in libcuda or the shim did not build"
        );
        let dir = root.join("target/debug");
        assert!(
            dir.join("libcuda.so.1").exists(),
            "libcuda.so.1 beside libcuda.so"
        );
        dir
    })
    .clone()
}

/// A time-sliced share of `gib` GiB at `priority` for `who` in tenant
/// `lab`, one hour from now (scheduled; the worker activates it).
pub async fn timeslice_share(
    app: &TestApp,
    who: &gpuslice::booking::Requester,
    gib: i32,
    priority: &str,
) -> i64 {
    use gpuslice::booking::{self, Created};
    use gpuslice::domain::booking::{BookingInput, Status};
    let req = BookingInput {
        tenant: "lab".into(),
        kind: "timeslice".into(),
        memory_gib: gib.to_string(),
        priority: priority.into(),
        hours: "1".into(),
        ..Default::default()
    }
    .parse()
    .unwrap();
    match booking::create(&app.pool, who, &req, None, &Default::default())
        .await
        .unwrap()
    {
        Created::New(b) => {
            assert_eq!(b.status, Status::Scheduled, "{b:?}");
            b.id
        }
        Created::Replayed(_) => unreachable!(),
    }
}

/// Whether a cgroup test must skip: `has` says the node has booking
/// cgroups; without, `what` is skipped loudly (or fails where
/// `GPUSLICE_REQUIRE_CGROUPS` is set).
pub fn skip_without_cgroups(has: bool, what: &str) -> bool {
    if has {
        return false;
    }
    let why = "not root, or no cgroup freezer under /sys/fs/cgroup";
    if std::env::var_os("GPUSLICE_REQUIRE_CGROUPS").is_some() {
        panic!("{what} required but {why}");
    }
    skipped(what, why);
    true
}

/// Waits until the workers registered `n` GPUs.
pub async fn gpus_seen(app: &TestApp, n: i64) {
    wait_for("the worker's GPU", || async {
        app.one::<i64>("SELECT count(*) FROM gpus").await == n
    })
    .await;
}
