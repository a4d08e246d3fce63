//! The command line (contract in architecture.md): `serve`, `worker`,
//! `migrate`, `demo`, `tenant add`, `user add|link`, `token create`, `exec`,
//! `gpu-check`, `bench`. Without `DATABASE_URL` every command uses the
//! embedded cluster of `GPUSLICE_DATA_DIR`. This is the composition root:
//! [`args`] holds the flags, one file per command does its work, and
//! [`node`] starts a GPU node's parts the same way for every backend.

mod admin;
mod alerts;
pub mod args;
mod bench;
mod exec;
mod gpu_check;
pub mod isolate;
mod node;
mod serve;
mod sim;

use std::io::Read;

use anyhow::{Context, Result};

use crate::db::{self, Database};

pub use admin::{tenant_add, tenant_edit, token_create, user_add, user_link};
pub use args::{
    AlertCommand, BenchCommand, Cli, Command, GpuArgs, IdleArgs, ServeArgs, SimCommand,
    TenantAddArgs, TenantCommand, TenantEditArgs, TokenCommand, UserAddArgs, UserCommand,
    WorkerArgs,
};
pub use bench::bench;
pub use node::{start_workers, Node, NodeSettings};
pub use serve::{seed_demo, DEMO_PASSWORD, DEMO_USERS};

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
/// `gpuslice healthcheck`: `GET /healthz` on the server at `bind`.
async fn healthcheck(bind: &str) -> Result<()> {
    let addr: std::net::SocketAddr = bind
        .parse()
        .map_err(|_| anyhow::anyhow!("--bind: give an address such as 127.0.0.1:8080"))?;
    let host = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    let url = format!("http://{host}:{}/healthz", addr.port());
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .build()?;
    let r = client
        .get(&url)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{url} did not answer: {e}"))?;
    if !r.status().is_success() {
        anyhow::bail!("{url} answered {}", r.status());
    }
    Ok(())
}

/// `gpuslice exec`: synchronous, and run by `main` before the async
/// runtime starts (`--isolate pid` needs a process with one thread).
pub fn exec_command(cli: &Cli) -> Result<()> {
    let Command::Exec {
        booking,
        socket,
        isolate,
        docker_args,
        cmd,
    } = &cli.command
    else {
        anyhow::bail!("not an exec command");
    };
    let socket = socket
        .clone()
        .unwrap_or_else(|| cli.data_dir.join("exec.sock"));
    if *docker_args {
        return exec::docker_args(&socket, *booking);
    }
    exec::exec(&socket, *booking, cmd, isolate.is_some())
}

pub async fn run(cli: Cli) -> Result<()> {
    match &cli.command {
        Command::GpuCheck {
            nvml_lib,
            lockdown_only,
            json,
            dev_dir,
            probe_cgroup,
        } => {
            return gpu_check::run(
                nvml_lib.as_deref(),
                *json,
                *lockdown_only,
                dev_dir,
                probe_cgroup,
            )
        }
        Command::Exec { .. } => return exec_command(&cli),
        Command::Bench(BenchCommand::Telemetry {
            gpus,
            instances,
            rounds,
            fleet,
            interval_secs,
        }) => {
            let database = Database::open(cli.database_url.as_deref(), &cli.data_dir).await?;
            let result = crate::bench::telemetry::run(
                &database,
                &crate::bench::telemetry::Params {
                    gpus: *gpus,
                    instances: *instances,
                    rounds: *rounds,
                    fleet: *fleet,
                    interval_secs: *interval_secs,
                },
            )
            .await;
            let closed = database.close().await;
            return result.and(closed);
        }
        Command::Bench(BenchCommand::History { rows, months, seed }) => {
            let database = Database::open(cli.database_url.as_deref(), &cli.data_dir).await?;
            let result = async {
                let pool = database.pool().await?;
                db::migrate(&pool).await?;
                let made = crate::bench::history::run(&pool, *rows, *months, *seed).await?;
                println!(
                    "made {} usage rows of {} ended bookings ({} tenants, {} months ending now) in {:.1} s ({:.0} rows/s); daily rollup rows in the database: {}",
                    made.usage_rows,
                    made.bookings,
                    made.tenants,
                    made.months,
                    made.secs,
                    made.usage_rows as f64 / made.secs.max(1e-9),
                    made.rollup_rows
                );
                anyhow::Ok(())
            }
            .await;
            let closed = database.close().await;
            return result.and(closed);
        }
        Command::Bench(b) => return bench(b),
        Command::Sim { cmd, gpu } => {
            println!("{}", sim::sim(cmd, gpu, &cli.data_dir)?);
            return Ok(());
        }
        Command::Healthcheck { bind } => return healthcheck(bind).await,
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
    // The long-running commands keep the embedded server alive.
    let _supervisor = match (database, &command) {
        (Database::Embedded(c), Command::Serve(_) | Command::Demo(_) | Command::Worker(_)) => Some(
            AbortOnDrop(c.supervise(pool.clone(), std::time::Duration::from_secs(2))),
        ),
        _ => None,
    };
    match command {
        Command::GpuCheck { .. }
        | Command::Bench(_)
        | Command::Exec { .. }
        | Command::Sim { .. }
        | Command::Healthcheck { .. } => Ok(()),
        Command::Alert(cmd) => {
            print!("{}", alerts::alert(&pool, &cmd).await?);
            println!();
            Ok(())
        }
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
        Command::Serve(args) => serve::serve(pool, &args, data_dir).await,
        Command::Worker(args) => {
            let mut gpu = args.gpu.clone();
            gpu.node_name = Some(args.node.clone());
            let shutdown = shutdown_signal();
            let mut tasks = node::start_watch(&pool, &gpu)?;
            tasks.extend(start_workers(&pool, &gpu, data_dir, Some(&args.node))?);
            shutdown.await;
            for t in tasks {
                t.abort();
            }
            Ok(())
        }
        Command::Demo(args) => {
            seed_demo(&pool).await?;
            serve::print_demo(&args.bind);
            serve::serve(pool, &args, data_dir).await
        }
        Command::Tenant(TenantCommand::Add(args)) => {
            let id = tenant_add(&pool, &args).await?;
            println!("created tenant {} (id {id})", args.slug.trim());
            Ok(())
        }
        Command::Tenant(TenantCommand::Edit(args)) => {
            let idle = tenant_edit(&pool, &args).await?;
            println!(
                "tenant {}: idle after {} minutes (0 = off), grace {} minutes, then {}",
                args.slug.trim(),
                idle.after_minutes,
                idle.grace_minutes,
                idle.action
            );
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

/// Resolves on SIGTERM or Ctrl-C. The handlers are installed when this is
/// called, not when it is first awaited: a signal that arrives while the
/// rest starts up (workers, the first heartbeat) still shuts down cleanly
/// instead of killing the process.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let int = signal(SignalKind::interrupt()).ok();
    let term = signal(SignalKind::terminate()).ok();
    async move {
        let wait = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = wait(int) => {},
            _ = wait(term) => {},
        }
        tracing::info!("shutting down: finishing requests in flight");
    }
}

/// Stops a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
