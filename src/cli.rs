//! The command line (contract in the README): `serve`, `migrate`, `demo`,
//! `tenant add`, `user add`, `token create`. Without `DATABASE_URL` every
//! command uses the embedded cluster of `GPUSLICE_DATA_DIR`.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use sqlx::PgPool;

use crate::db::{self, audit::Actor, Database};
use crate::domain::{
    self, parse_membership_arg, parse_name, Email, GlobalRole, Password, Quota, QuotaInput, Slug,
};
use crate::web::{self, AppState, WebSettings};

#[derive(Debug, Parser)]
#[command(
    name = "gpuslice",
    version,
    about = "Book slices of NVIDIA GPUs: MIG instances and time-sliced shares"
)]
pub struct Cli {
    /// PostgreSQL URL; unset: a private cluster under the data directory.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Folder for the embedded database and local state.
    #[arg(
        long,
        env = "GPUSLICE_DATA_DIR",
        default_value = "./gpuslice-data",
        global = true
    )]
    pub data_dir: PathBuf,
    /// Log as JSON lines (for log collectors).
    #[arg(long, env = "GPUSLICE_LOG_JSON", global = true)]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the web application.
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate,
    /// Serve with demo tenants and users (prints how to sign in).
    Demo(ServeArgs),
    /// Run the worker of one GPU node (inventory and heartbeat).
    Worker(WorkerArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Read-only check of a real GPU machine: what NVML reports (GPUs, MIG
    /// mode, profiles with ids, possible placements) next to the catalog.
    /// Changes no GPU setting. Needs no database.
    GpuCheck {
        /// Path of libnvidia-ml (default: the system's).
        #[arg(long, env = "GPUSLICE_NVML_LIB")]
        nvml_lib: Option<PathBuf>,
    },
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Manage users.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Run CMD inside an active booking on this GPU node: joins the booking's
    /// cgroup through the local worker and sets CUDA_VISIBLE_DEVICES.
    /// Needs no database; exits with CMD's status.
    Exec {
        /// The booking's number.
        booking: i64,
        /// The local worker's socket (default: <data dir>/exec.sock).
        #[arg(long, env = "GPUSLICE_EXEC_SOCKET")]
        socket: Option<PathBuf>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "GPUSLICE_BIND", default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// Mark cookies Secure (serve over HTTPS, e.g. behind a TLS proxy).
    #[arg(long, env = "GPUSLICE_SECURE_COOKIES")]
    pub secure_cookies: bool,
    /// Trust X-Forwarded-For for the client address (behind a proxy only).
    #[arg(long, env = "GPUSLICE_TRUST_PROXY")]
    pub trust_proxy: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Serve the web application only, without the in-process worker.
    #[arg(long)]
    pub no_worker: bool,
    /// Minutes of inactivity after which a session ends.
    #[arg(long, env = "GPUSLICE_SESSION_IDLE_MINUTES", default_value_t = 120)]
    pub session_idle_minutes: i64,
    /// Hours after sign-in after which a session ends regardless.
    #[arg(long, env = "GPUSLICE_SESSION_MAX_HOURS", default_value_t = 12)]
    pub session_max_hours: i64,
    /// How many days ahead a booking may start.
    #[arg(long, env = "GPUSLICE_MAX_AHEAD_DAYS", default_value_t = 90, value_parser = clap::value_parser!(i64).range(1..=3650))]
    pub max_ahead_days: i64,
    /// Currency of tariffs and reports (ISO 4217 code, e.g. EUR, USD, CHF).
    #[arg(long, env = "GPUSLICE_CURRENCY", default_value = "EUR")]
    pub currency: String,
}

/// Where the GPUs come from: the settings of a worker.
#[derive(Debug, Args, Clone)]
pub struct GpuArgs {
    /// GPU backend: auto (NVML when a driver is present, else the simulated
    /// fleet), nvml or sim.
    #[arg(long, env = "GPUSLICE_BACKEND", default_value = "auto", value_parser = ["auto", "nvml", "sim"])]
    pub backend: String,
    /// Fleet file for the simulated backend (TOML); unset: the demo fleet.
    #[arg(long, env = "GPUSLICE_FLEET")]
    pub fleet: Option<PathBuf>,
    /// Path of libnvidia-ml for the NVML backend (default: the system's).
    #[arg(long, env = "GPUSLICE_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// GPUs the NVML backend manages: comma-separated uuids or indexes (default: all).
    #[arg(long, env = "GPUSLICE_NVML_GPUS", value_delimiter = ',')]
    pub nvml_gpus: Option<Vec<String>>,
    /// Let the NVML backend change a GPU's MIG mode when an admin asks (off: it never does).
    #[arg(long, env = "GPUSLICE_NVML_ALLOW_MODE_CHANGE")]
    pub nvml_allow_mode_change: bool,
    /// Name of this node for the NVML backend (default: the host name).
    #[arg(long = "node-name", env = "GPUSLICE_NODE")]
    pub node_name: Option<String>,
    /// Time-sliced shares per GPU on NVML nodes (the fleet file sets it for sim).
    #[arg(long, env = "GPUSLICE_MAX_SHARES", default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=64))]
    pub max_shares: i32,
    /// How often the worker looks for bookings to start or end (milliseconds).
    #[arg(long, env = "GPUSLICE_WORKER_TICK_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub worker_tick_ms: u64,
    /// Warn this many minutes before a booking ends.
    #[arg(long, env = "GPUSLICE_WARN_MINUTES", default_value_t = 15, value_parser = clap::value_parser!(u64).range(0..=1440))]
    pub warn_minutes: u64,
    /// Booking cgroups (isolation and time-slicing): auto (when root with a
    /// freezer) or off.
    #[arg(long, env = "GPUSLICE_CGROUPS", default_value = "auto", value_parser = ["auto", "off"])]
    pub cgroups: String,
    /// Host memory a booking's processes may use, GiB per compute slice (a whole GPU is 7 slices).
    #[arg(long, env = "GPUSLICE_HOST_MEMORY_GIB_PER_SLICE", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub host_memory_gib_per_slice: u64,
    /// CPUs bookings' processes may use (a cpuset list such as 0-15; default: all).
    #[arg(long, env = "GPUSLICE_BOOKING_CPUS")]
    pub booking_cpus: Option<String>,
    /// Seconds a share's process may stay over the share's GPU memory after the warning.
    #[arg(long, env = "GPUSLICE_SHARE_MEMORY_GRACE_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub share_memory_grace_secs: u64,
    /// Socket of `gpuslice exec` (default: <data dir>/exec.sock).
    #[arg(long, env = "GPUSLICE_EXEC_SOCKET")]
    pub exec_socket: Option<PathBuf>,
    /// Seconds processes on a device get between SIGTERM and SIGKILL when its booking ends.
    #[arg(long, env = "GPUSLICE_GRACE_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub grace_secs: u64,
    /// Length of a metering interval in seconds (one usage row per booking per interval).
    #[arg(long, env = "GPUSLICE_METER_INTERVAL_SECS", default_value_t = 60, value_parser = clap::value_parser!(i64).range(1..=3600))]
    pub meter_interval_secs: i64,
    /// Usage rows the local spool holds while PostgreSQL is unreachable.
    #[arg(long, env = "GPUSLICE_SPOOL_MAX_ROWS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(100..=100_000_000))]
    pub spool_max_rows: u64,
}

impl GpuArgs {
    /// The cgroup layout for a node's bookings, if cgroups are on and usable.
    pub fn cgroups_for(&self, node: &str) -> Option<crate::cgroup::Layout> {
        if self.cgroups == "off" {
            return None;
        }
        let l = crate::worker::shares::layout_for(node);
        if l.is_none() {
            tracing::warn!(node = %node, "no cgroups (not root, or no freezer): bookings are not isolated and shares are not time-sliced");
        }
        l
    }

    /// Starts the per-node parts that need cgroups (the shares' scheduler)
    /// and the exec socket for `nodes`.
    fn start_isolation(
        &self,
        pool: &PgPool,
        data_dir: &std::path::Path,
        nodes: &[(
            String,
            std::sync::Arc<dyn crate::gpu::GpuBackend>,
            Option<crate::cgroup::Layout>,
        )],
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        for (node, backend, layout) in nodes {
            if let Some(l) = layout {
                tasks.push(tokio::spawn(crate::worker::shares::run(
                    pool.clone(),
                    node.clone(),
                    backend.clone(),
                    l.clone(),
                    std::time::Duration::from_secs(self.share_memory_grace_secs),
                )));
            }
        }
        let socket = self
            .exec_socket
            .clone()
            .unwrap_or_else(|| data_dir.join("exec.sock"));
        let map = nodes
            .iter()
            .map(|(n, _, l)| (n.clone(), l.clone()))
            .collect();
        tasks.push(tokio::spawn(crate::worker::exec::serve(
            pool.clone(),
            socket,
            map,
        )));
        tasks
    }

    /// The meter's settings.
    pub fn meter_settings(&self) -> crate::worker::meter::Settings {
        crate::worker::meter::Settings {
            interval_secs: self.meter_interval_secs,
            tick: std::time::Duration::from_secs((self.meter_interval_secs as u64 / 6).clamp(1, 5)),
            spool_max_rows: self.spool_max_rows as usize,
        }
    }

    /// The booking worker's settings.
    pub fn worker_settings(&self) -> crate::worker::bookings::Settings {
        crate::worker::bookings::Settings {
            tick: std::time::Duration::from_millis(self.worker_tick_ms),
            warn_secs: (self.warn_minutes * 60) as f64,
            grace: std::time::Duration::from_secs(self.grace_secs),
            host_memory_gib_per_slice: self.host_memory_gib_per_slice,
            cpus: self.booking_cpus.clone(),
            ..Default::default()
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Decision latency of MIG placement on a large, loaded fleet.
    Latency {
        #[arg(long, default_value_t = 10_000)]
        gpus: usize,
        #[arg(long, default_value_t = 100_000)]
        bookings: usize,
        #[arg(long, default_value_t = 2_000)]
        decisions: usize,
        #[arg(long)]
        json: bool,
    },
    /// Time-slice scheduler: tick cost with 1,000 shares; as root, the
    /// achieved 4:2:1 ratio of real busy processes and the switch latency.
    Scheduler {
        /// Seconds each real-process run lasts.
        #[arg(long, default_value_t = 15)]
        secs: u64,
    },
    /// MIG benchmark: H100-80GB fleet, request stream from the trace's pods.
    Mig {
        /// Pod list CSV with creation_time and deletion_time.
        #[arg(long)]
        pods: PathBuf,
        /// Number of H100-80GB GPUs (the default trace peaks at 472 compute
        /// slices, about 67 GPUs: 50 is heavy load).
        #[arg(long, default_value_t = 50)]
        gpus: usize,
        /// Arrivals this many times faster (durations unchanged): more
        /// load on the same fleet. 1 replays the trace's own times.
        #[arg(long, default_value_t = 1.0)]
        speedup: f64,
        #[arg(long, default_value = "42")]
        seeds: String,
        #[arg(long)]
        json: bool,
    },
    /// Replays a cluster trace (FGD's method) under placement policies.
    Replay {
        /// Node list CSV (sn, cpu_milli, memory_mib, gpu, model).
        #[arg(long)]
        nodes: PathBuf,
        /// Pod list CSV (name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, ...).
        #[arg(long)]
        pods: PathBuf,
        /// first-fit, best-fit, fgd, gpuslice, or all (comma-separated list allowed).
        #[arg(long, default_value = "all")]
        policy: String,
        /// Seeds: 42..51 (inclusive), or a comma-separated list.
        #[arg(long, default_value = "42..51")]
        seeds: String,
        /// Print JSON (with per-seed results and curves) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The node this worker runs (a node of the fleet file for sim).
    #[arg(long)]
    pub node: String,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant with its quota.
    Add(TenantAddArgs),
}

#[derive(Debug, Args)]
pub struct TenantAddArgs {
    #[arg(long)]
    pub slug: String,
    #[arg(long)]
    pub name: String,
    #[arg(long, allow_hyphen_values = true)]
    pub max_active_bookings: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub max_gpu_memory_gib: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub max_compute_slices: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub monthly_slice_hours: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub max_booking_hours: Option<String>,
    /// high, normal or low.
    #[arg(long)]
    pub priority: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub guaranteed_share_pct: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user; the password is read from standard input.
    Add(UserAddArgs),
    /// Link a user to their Unix account on the GPU nodes (for `gpuslice exec`).
    Link {
        #[arg(long)]
        email: String,
        /// The account name; `--unix-user ''` removes the link.
        #[arg(long)]
        unix_user: String,
    },
}

#[derive(Debug, Args)]
pub struct UserAddArgs {
    #[arg(long)]
    pub email: String,
    /// Display name (default: the part of the address before @).
    #[arg(long)]
    pub name: Option<String>,
    /// Platform role: admin, finance or none.
    #[arg(long, default_value = "none")]
    pub role: String,
    /// Tenant membership as SLUG or SLUG:manager; repeat for several.
    #[arg(long = "tenant")]
    pub tenants: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create an API token for a user and print it.
    Create {
        #[arg(long)]
        email: String,
        #[arg(long, default_value = "cli")]
        name: String,
    },
}

pub fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_sessions=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        let _ = builder.json().try_init();
    } else {
        let _ = builder.try_init();
    }
}

/// Runs one command.
pub async fn run(cli: Cli) -> Result<()> {
    match &cli.command {
        Command::GpuCheck { nvml_lib } => return gpu_check(nvml_lib.as_deref()),
        Command::Exec {
            booking,
            socket,
            cmd,
        } => {
            let socket = socket
                .clone()
                .unwrap_or_else(|| cli.data_dir.join("exec.sock"));
            return exec(&socket, *booking, cmd);
        }
        Command::Bench(b) => return bench(b),
        _ => {}
    }
    let database = Database::open(cli.database_url.as_deref(), &cli.data_dir).await?;
    let result = run_with(&database, cli.command, &cli.data_dir).await;
    let closed = database.close().await;
    result.and(closed)
}

async fn run_with(database: &Database, command: Command, data_dir: &std::path::Path) -> Result<()> {
    let pool = database.pool().await?;
    db::migrate(&pool).await?;
    match command {
        Command::GpuCheck { .. } | Command::Bench(_) | Command::Exec { .. } => Ok(()),
        Command::User(UserCommand::Link { email, unix_user }) => {
            user_link(&pool, &email, &unix_user).await?;
            println!(
                "linked {} to Unix account \"{}\"",
                email.trim().to_lowercase(),
                unix_user.trim()
            );
            Ok(())
        }
        Command::Migrate => {
            println!("database is up to date");
            Ok(())
        }
        Command::Serve(args) => serve(pool, &args, data_dir).await,
        Command::Worker(args) => {
            let mut gpu = args.gpu.clone();
            gpu.node_name = Some(args.node.clone());
            let tasks = start_workers(&pool, &gpu, data_dir, Some(&args.node))?;
            shutdown_signal().await;
            for t in tasks {
                t.abort();
            }
            Ok(())
        }
        Command::Demo(args) => {
            seed_demo(&pool).await?;
            print_demo(&args.bind);
            serve(pool, &args, data_dir).await
        }
        Command::Tenant(TenantCommand::Add(args)) => {
            let id = tenant_add(&pool, &args).await?;
            println!("created tenant {} (id {id})", args.slug.trim());
            Ok(())
        }
        Command::User(UserCommand::Add(args)) => {
            let mut password = String::new();
            std::io::stdin()
                .read_to_string(&mut password)
                .context("cannot read the password from standard input")?;
            let password = password.trim_end_matches(['\n', '\r']);
            let id = user_add(&pool, &args, password).await?;
            println!(
                "created user {} (id {id})",
                args.email.trim().to_lowercase()
            );
            Ok(())
        }
        Command::Token(TokenCommand::Create { email, name }) => {
            println!("{}", token_create(&pool, &email, &name).await?);
            Ok(())
        }
    }
}

/// `gpuslice exec`: joins the booking through the local worker, then
/// replaces this process with `cmd` (so its exit status is CMD's).
fn exec(socket: &std::path::Path, booking: i64, cmd: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let reply = crate::worker::exec::request(socket, booking).map_err(|e| anyhow!(e))?;
    if !reply.ok {
        bail!(
            "{}",
            reply.error.unwrap_or_else(|| "the worker refused".into())
        );
    }
    let device = reply.device.unwrap_or_default();
    if !reply.isolated {
        eprintln!(
            "gpuslice: this node has no cgroups; {cmd:?} runs without isolation",
            cmd = cmd[0]
        );
    }
    let err = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("CUDA_VISIBLE_DEVICES", &device)
        .env("NVIDIA_VISIBLE_DEVICES", &device)
        .env("GPUSLICE_BOOKING", booking.to_string())
        .exec();
    bail!("cannot run {}: {err}", cmd[0])
}

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

/// `bench replay`: FGD's trace replay under the chosen policies.
pub fn bench(cmd: &BenchCommand) -> Result<()> {
    use crate::bench::replay;
    use crate::placement::cluster::Policy;
    let (nodes, pods, policy, seeds, json) = match cmd {
        BenchCommand::Mig {
            pods,
            gpus,
            speedup,
            seeds,
            json,
        } => return bench_mig(pods, *gpus, *speedup, seeds, *json),
        BenchCommand::Latency {
            gpus,
            bookings,
            decisions,
            json,
        } => return bench_latency(*gpus, *bookings, *decisions, *json),
        BenchCommand::Scheduler { secs } => return crate::bench::scheduler::run(*secs),
        BenchCommand::Replay {
            nodes,
            pods,
            policy,
            seeds,
            json,
        } => (nodes, pods, policy, seeds, json),
    };
    let policies: Vec<Policy> = if policy == "all" {
        Policy::ALL.to_vec()
    } else {
        policy
            .split(',')
            .map(|p| Policy::parse(p.trim()).map_err(|e| anyhow!("--policy: {e}")))
            .collect::<Result<_>>()?
    };
    let seeds = replay::parse_seeds(seeds).map_err(|e| anyhow!(e))?;
    let trace = replay::Trace::load(nodes, pods).map_err(|e| anyhow!(e))?;
    let mut results = Vec::new();
    for p in policies {
        let started = std::time::Instant::now();
        let r = replay::run(&trace, p, &seeds);
        let secs = started.elapsed().as_secs_f64();
        if !json {
            let lo = r
                .per_seed
                .iter()
                .map(|s| s.allocation_pct_at_130)
                .fold(f64::MAX, f64::min);
            let hi = r
                .per_seed
                .iter()
                .map(|s| s.allocation_pct_at_130)
                .fold(f64::MIN, f64::max);
            println!(
                "{:<10} allocation at 130 %: {:6.2} % (seeds {:.2}–{:.2}), fragmentation at 100 %: {:5.2} %, {} seeds in {secs:.1} s",
                r.policy, r.allocation_pct_at_130, lo, hi, r.fragmentation_curve[100], seeds.len()
            );
        }
        results.push(r);
    }
    if *json {
        let out = if results.len() == 1 {
            serde_json::to_string_pretty(&results[0])?
        } else {
            serde_json::to_string_pretty(&results)?
        };
        println!("{out}");
    }
    Ok(())
}

fn bench_latency(gpus: usize, bookings: usize, decisions: usize, json: bool) -> Result<()> {
    if gpus == 0 || decisions == 0 {
        bail!("--gpus and --decisions must be at least 1");
    }
    let results = crate::bench::latency::run(gpus, bookings, decisions, 42);
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for r in results {
            println!(
                "{:<10} {} GPUs, {} bookings: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs over {} decisions (time index built once in {:.1} ms)",
                r.policy, r.gpus, r.bookings, r.p50_us, r.p99_us, r.max_us, r.decisions, r.index_ms
            );
        }
    }
    Ok(())
}

fn bench_mig(
    pods: &std::path::Path,
    gpus: usize,
    speedup: f64,
    seeds: &str,
    json: bool,
) -> Result<()> {
    use crate::bench::{mig, replay::parse_seeds};
    use crate::placement::mig::MigPolicy;
    if gpus == 0 {
        bail!("--gpus: the fleet needs at least one GPU");
    }
    if !(speedup.is_finite() && speedup > 0.0) {
        bail!("--speedup must be a positive number (1 replays the trace's own times)");
    }
    let mut all = Vec::new();
    for seed in parse_seeds(seeds).map_err(|e| anyhow!(e))? {
        let stream = mig::stream(pods, seed, speedup).map_err(|e| anyhow!(e))?;
        let mut base = None;
        let runs = MigPolicy::ALL.into_iter().map(Some).chain([None]);
        for p in runs {
            let started = std::time::Instant::now();
            let r = match p {
                Some(p) => mig::run(&stream, gpus, p),
                None => mig::run_repack(&stream, gpus),
            };
            let base_acc = *base.get_or_insert(r.accepted);
            if !json {
                println!(
                    "seed {seed} {:<10} accepted {:>6} of {} ({:5.2} %, {:+5.1} % vs first-fit), served {:9.0} slice-hours, stranded slices {:7.1}, {:.1} s",
                    r.policy,
                    r.accepted,
                    r.requests,
                    r.acceptance_pct,
                    100.0 * (r.accepted as f64 / base_acc.max(1) as f64 - 1.0),
                    r.served_slice_hours,
                    r.mean_stranded_slices,
                    started.elapsed().as_secs_f64()
                );
            }
            all.push(serde_json::json!({"seed": seed, "result": r}));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}

/// `gpu-check`: prints the GPUs and every GPU-instance profile as NVML
/// reports them, flagging where the catalog disagrees. Read-only.
pub fn gpu_check(lib: Option<&std::path::Path>) -> Result<()> {
    use crate::gpu::{nvml::NvmlBackend, GpuBackend};
    let b = NvmlBackend::open(lib, None, false).map_err(|e| anyhow!(e))?;
    println!(
        "{:<5} {:<40} {:<32} {:<12} {:>10}  mig (now/after reset)",
        "gpu", "uuid", "product", "catalog", "MiB"
    );
    for g in b.inventory()? {
        println!(
            "{:<5} {:<40} {:<32} {:<12} {:>10}  {}/{}",
            g.index,
            g.uuid,
            g.product,
            g.model.as_deref().unwrap_or("(unknown)"),
            g.memory_mib,
            if g.mig_current { "on" } else { "off" },
            if g.mig_pending { "on" } else { "off" }
        );
    }
    println!();
    println!(
        "{:<5} {:>4} {:<12} {:>4} {:>6} {:>5} {:>8}  {:<40} verdict",
        "gpu", "enum", "profile", "id", "slices", "max", "MiB", "possible placements (start:size)"
    );
    let rows = b.check_profiles()?;
    for r in &rows {
        let opt = |v: Option<u32>| v.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        let placements = r
            .placements
            .as_ref()
            .map(|p| {
                p.iter()
                    .map(|x| format!("{}:{}", x.start, x.size))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| "-".into());
        let verdict = match (&r.catalog_name, r.nvml_id, r.agrees) {
            (_, _, true) => "agrees",
            (None, Some(_), _) => "NOT IN CATALOG",
            (Some(_), None, _) => "not offered by the driver",
            _ => "DIFFERS",
        };
        println!(
            "{:<5} {:>4} {:<12} {:>4} {:>6} {:>5} {:>8}  {:<40} {verdict}",
            r.gpu_index,
            r.nvml_enum,
            r.catalog_name.as_deref().unwrap_or("?"),
            opt(r.nvml_id),
            opt(r.slices),
            opt(r.instance_count),
            r.memory_mib
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".into()),
            placements
        );
    }
    let agree = rows.iter().filter(|r| r.agrees).count();
    println!();
    println!("{agree} of {} profiles agree with the catalog", rows.len());
    Ok(())
}

/// Starts the inventory of the GPUs this process drives: the local GPUs
/// through NVML, or the nodes of the simulated fleet (only `only_node` when
/// given). With `auto`, NVML is tried first and the simulation is the
/// fallback. Returns the tasks (they end with the process).
pub fn start_workers(
    pool: &PgPool,
    gpu: &GpuArgs,
    data_dir: &std::path::Path,
    only_node: Option<&str>,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    use crate::gpu::{fleet::Fleet, nvml::NvmlBackend, sim::SimBackend, GpuBackend};
    use std::sync::Arc;
    if gpu.backend != "sim" {
        match NvmlBackend::open(
            gpu.nvml_lib.as_deref(),
            gpu.nvml_gpus.clone(),
            gpu.nvml_allow_mode_change,
        ) {
            Ok(b) => {
                let node = match &gpu.node_name {
                    Some(n) => n.clone(),
                    None => nix::unistd::gethostname()
                        .map(|h| h.to_string_lossy().to_string())
                        .unwrap_or_else(|_| "localhost".into()),
                };
                let backend: Arc<dyn GpuBackend> = Arc::new(b);
                let shares = gpu.max_shares;
                tracing::info!(node = %node, "worker started on the NVML backend");
                let layout = gpu.cgroups_for(&node);
                let mut settings = gpu.worker_settings();
                settings.cgroups = layout.clone();
                let mut tasks =
                    gpu.start_isolation(pool, data_dir, &[(node.clone(), backend.clone(), layout)]);
                tasks.extend([
                    tokio::spawn(crate::worker::run_inventory(
                        pool.clone(),
                        node.clone(),
                        backend.clone(),
                        Arc::new(move |_: &str| shares),
                    )),
                    tokio::spawn(crate::worker::bookings::run(
                        pool.clone(),
                        node.clone(),
                        backend.clone(),
                        settings,
                    )),
                    tokio::spawn(crate::worker::meter::run(
                        pool.clone(),
                        node,
                        backend,
                        data_dir.join("spool"),
                        gpu.meter_settings(),
                    )),
                    tokio::spawn(crate::worker::bookings::run_planner(
                        pool.clone(),
                        std::time::Duration::from_millis(gpu.worker_tick_ms),
                    )),
                ]);
                return Ok(tasks);
            }
            Err(e) if gpu.backend == "nvml" => bail!("{e}"),
            Err(e) => {
                tracing::info!(reason = %e, "no usable NVIDIA driver; using the simulated fleet")
            }
        }
    }
    let fleet = Fleet::load(gpu.fleet.as_deref()).map_err(|e| anyhow!(e))?;
    if let Some(n) = only_node {
        if fleet.node(n).is_none() {
            bail!("--node: the fleet has no node named \"{n}\"");
        }
    }
    let state_dir = data_dir.join("sim");
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("cannot create {}", state_dir.display()))?;
    let mut tasks = Vec::new();
    let mut isolated = Vec::new();
    for node in fleet
        .nodes
        .iter()
        .filter(|n| only_node.is_none_or(|o| o == n.name))
    {
        let backend =
            SimBackend::open(&fleet, &node.name, Some(&state_dir)).map_err(|e| anyhow!(e))?;
        let backend: Arc<dyn GpuBackend> = Arc::new(backend);
        // max_shares comes from the fleet file, by GPU uuid.
        let shares: std::collections::HashMap<String, i32> = node
            .gpus
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.max_shares as i32, g.count as usize))
            .enumerate()
            .map(|(i, s)| (crate::gpu::sim::gpu_uuid(&node.name, i as u32), s))
            .collect();
        let max_shares = Arc::new(move |uuid: &str| shares.get(uuid).copied().unwrap_or(4));
        tasks.push(tokio::spawn(crate::worker::run_inventory(
            pool.clone(),
            node.name.clone(),
            backend.clone(),
            max_shares,
        )));
        let layout = gpu.cgroups_for(&node.name);
        let mut settings = gpu.worker_settings();
        settings.cgroups = layout.clone();
        isolated.push((node.name.clone(), backend.clone(), layout));
        tasks.push(tokio::spawn(crate::worker::bookings::run(
            pool.clone(),
            node.name.clone(),
            backend.clone(),
            settings,
        )));
        tasks.push(tokio::spawn(crate::worker::meter::run(
            pool.clone(),
            node.name.clone(),
            backend,
            data_dir.join("spool"),
            gpu.meter_settings(),
        )));
    }
    // Queued bookings wait for capacity anywhere, so one planner serves
    // the process (several processes planning at once is safe: tenant
    // locks and the exclusion constraint keep them apart).
    tasks.push(tokio::spawn(crate::worker::bookings::run_planner(
        pool.clone(),
        std::time::Duration::from_millis(gpu.worker_tick_ms),
    )));
    tracing::info!(
        nodes = isolated.len(),
        "worker started for the simulated fleet"
    );
    tasks.extend(gpu.start_isolation(pool, data_dir, &isolated));
    Ok(tasks)
}

async fn serve(pool: PgPool, args: &ServeArgs, data_dir: &std::path::Path) -> Result<()> {
    if args.session_idle_minutes < 1 || args.session_max_hours < 1 {
        bail!("session lifetimes must be at least one minute (idle) and one hour (absolute)");
    }
    let settings = WebSettings {
        secure_cookies: args.secure_cookies,
        trust_proxy: args.trust_proxy,
        session_idle_secs: args.session_idle_minutes * 60,
        session_absolute_secs: args.session_max_hours * 3600,
    };
    let workers = if args.no_worker {
        Vec::new()
    } else {
        start_workers(&pool, &args.gpu, data_dir, None)?
    };
    let currency = args.currency.trim().to_uppercase();
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_uppercase()) {
        bail!("--currency: give a three-letter ISO 4217 code such as EUR or USD");
    }
    let mut state = AppState::new(pool, settings).await?;
    state.currency = std::sync::Arc::from(currency.as_str());
    state.booking_settings = std::sync::Arc::new(crate::booking::Settings {
        max_ahead_days: args.max_ahead_days,
        ..Default::default()
    });
    let listener = tokio::net::TcpListener::bind(&args.bind)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (set GPUSLICE_BIND to another address)",
                args.bind
            )
        })?;
    tracing::info!(addr = %listener.local_addr()?, "gpuslice is serving");
    let served = web::serve(listener, state, shutdown_signal()).await;
    for w in workers {
        w.abort();
    }
    served
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
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
        json!({"name": name}),
    )
    .await?;
    tx.commit().await?;
    Ok(id)
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

fn print_demo(bind: &str) {
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
