//! The command line's arguments and settings (contract in architecture.md).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
        /// Only the lock-down report (no NVML).
        #[arg(long)]
        lockdown_only: bool,
        /// NVML's answers as JSON (to diff against the catalog and commit
        /// as evidence), without the lock-down report.
        #[arg(long)]
        json: bool,
        /// Where the NVIDIA device files are.
        #[arg(long, default_value = "/dev")]
        dev_dir: PathBuf,
        /// The cgroup logins run in, where the lock-down probe runs
        /// (relative to each hierarchy under /sys/fs/cgroup).
        #[arg(long, default_value = "user.slice")]
        probe_cgroup: String,
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
    /// Stage faults and load on the simulated fleet (simulated backend
    /// only; writes the node's state file). Needs no database.
    Sim {
        #[command(subcommand)]
        cmd: SimCommand,
        #[command(flatten)]
        gpu: GpuArgs,
    },
    /// Alert rules: list them, or change one (audited).
    #[command(subcommand)]
    Alert(AlertCommand),
    /// Run CMD inside an active booking on this GPU node: joins the booking's
    /// cgroup through the local worker and sets CUDA_VISIBLE_DEVICES.
    /// Needs no database; exits with CMD's status.
    Exec {
        /// The booking's number.
        booking: i64,
        /// The local worker's socket (default: <data dir>/exec.sock).
        #[arg(long, env = "GPUSLICE_EXEC_SOCKET")]
        socket: Option<PathBuf>,
        /// `pid`: run the command in its own PID namespace with a private
        /// /dev holding only the booking's device files.
        #[arg(long, value_parser = ["pid"])]
        isolate: Option<String>,
        /// Print the `docker run` arguments (before the image) that put a
        /// container into the booking, the launch shim and its share's
        /// regions included: `docker run --rm $(gpuslice exec --docker-args
        /// ID) IMAGE CMD`.
        #[arg(long, conflicts_with = "isolate")]
        docker_args: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required_unless_present = "docker_args")]
        cmd: Vec<String>,
    },
    /// Exits 0 when the server answers `GET /healthz` with 200 within 3 s
    /// (a container's HEALTHCHECK; needs no shell and no curl).
    Healthcheck {
        /// The server's address (0.0.0.0 is asked on 127.0.0.1).
        #[arg(long, env = "GPUSLICE_BIND", default_value = "127.0.0.1:8080")]
        bind: String,
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
    /// Trust X-Forwarded-For for the client address (behind one reverse
    /// proxy only): its right-most entry, the one that proxy added.
    #[arg(long, env = "GPUSLICE_TRUST_PROXY")]
    pub trust_proxy: bool,
    /// Reverse proxies (addresses or CIDRs, comma-separated) whose
    /// X-Forwarded-For entries are believed; the client is the right-most
    /// entry that is not one of them.
    #[arg(long, env = "GPUSLICE_TRUSTED_PROXIES", value_delimiter = ',', value_parser = parse_net)]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Seconds a request may take to produce its response (a download may
    /// stream longer).
    #[arg(long, env = "GPUSLICE_REQUEST_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub request_timeout_secs: u64,
    /// Requests served at once; beyond it the server answers 503 with Retry-After.
    #[arg(long, env = "GPUSLICE_MAX_CONCURRENT_REQUESTS", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_concurrent_requests: u64,
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
    /// The site's address as people reach it, e.g. https://gpus.uni.edu
    /// (links in e-mails, calendar addresses, the OpenID Connect redirect);
    /// unset: made from --bind.
    #[arg(long, env = "GPUSLICE_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Bearer token `/metrics` asks for (unset: `/metrics` is open).
    #[arg(long, env = "GPUSLICE_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    #[command(flatten)]
    pub sso: SsoArgs,
}

/// Single sign-on: OpenID Connect, LDAP, the group mapping and whether
/// local passwords still work.
#[derive(Debug, Args, Clone, Default)]
pub struct SsoArgs {
    /// OpenID Connect issuer URL (e.g. https://login.uni.edu/realms/campus); unset: off.
    #[arg(long, env = "GPUSLICE_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,
    #[arg(long, env = "GPUSLICE_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,
    #[arg(long, env = "GPUSLICE_OIDC_CLIENT_SECRET", hide_env_values = true)]
    pub oidc_client_secret: Option<String>,
    /// Scopes asked for, space-separated (openid is always asked).
    #[arg(
        long,
        env = "GPUSLICE_OIDC_SCOPES",
        default_value = "openid email profile"
    )]
    pub oidc_scopes: String,
    /// The ID token claim that holds the e-mail address.
    #[arg(long, env = "GPUSLICE_OIDC_EMAIL_CLAIM", default_value = "email")]
    pub oidc_email_claim: String,
    /// The ID token claim that holds the groups.
    #[arg(long, env = "GPUSLICE_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
    /// The provider's name on the sign-in button.
    #[arg(long, env = "GPUSLICE_OIDC_NAME", default_value = "campus sign-on")]
    pub oidc_name: String,
    /// Take the e-mail claim as confirmed without email_verified (addresses the
    /// campus assigns, e.g. Entra ID's upn).
    #[arg(long, env = "GPUSLICE_OIDC_TRUST_EMAIL")]
    pub oidc_trust_email: bool,
    /// Redirect URL registered at the provider (default: this site's /auth/oidc/callback).
    #[arg(long, env = "GPUSLICE_OIDC_REDIRECT_URL")]
    pub oidc_redirect_url: Option<String>,
    /// LDAP server: ldaps://host, or ldap://host with --ldap-starttls; unset: off.
    #[arg(long, env = "GPUSLICE_LDAP_URL")]
    pub ldap_url: Option<String>,
    #[arg(long, env = "GPUSLICE_LDAP_STARTTLS")]
    pub ldap_starttls: bool,
    /// PEM file with the CA of the directory's certificate (default: the system's roots).
    #[arg(long, env = "GPUSLICE_LDAP_CA_FILE")]
    pub ldap_ca_file: Option<PathBuf>,
    /// Service account that searches for people and groups (unset: anonymous).
    #[arg(long, env = "GPUSLICE_LDAP_BIND_DN")]
    pub ldap_bind_dn: Option<String>,
    #[arg(long, env = "GPUSLICE_LDAP_BIND_PASSWORD", hide_env_values = true)]
    pub ldap_bind_password: Option<String>,
    /// Where people's entries live (e.g. ou=people,dc=uni,dc=edu).
    #[arg(long, env = "GPUSLICE_LDAP_USER_BASE", default_value = "")]
    pub ldap_user_base: String,
    /// How to find a person; {login} is the name typed.
    #[arg(
        long,
        env = "GPUSLICE_LDAP_USER_FILTER",
        default_value = "(|(uid={login})(mail={login}))"
    )]
    pub ldap_user_filter: String,
    /// Where groups live (unset: no groups are read).
    #[arg(long, env = "GPUSLICE_LDAP_GROUP_BASE")]
    pub ldap_group_base: Option<String>,
    /// How to find a person's groups; {dn} is their entry, {uid} their user name.
    #[arg(
        long,
        env = "GPUSLICE_LDAP_GROUP_FILTER",
        default_value = "(|(member={dn})(uniqueMember={dn})(memberUid={uid}))"
    )]
    pub ldap_group_filter: String,
    #[arg(long, env = "GPUSLICE_LDAP_GROUP_ATTR", default_value = "cn")]
    pub ldap_group_attr: String,
    #[arg(long, env = "GPUSLICE_LDAP_EMAIL_ATTR", default_value = "mail")]
    pub ldap_email_attr: String,
    #[arg(long, env = "GPUSLICE_LDAP_NAME_ATTR", default_value = "cn")]
    pub ldap_name_attr: String,
    #[arg(long, env = "GPUSLICE_LDAP_UID_ATTR", default_value = "uid")]
    pub ldap_uid_attr: String,
    /// Groups to tenants and roles: group=tenant-slug[:member|manager] or
    /// group=platform:admin|finance, comma-separated.
    #[arg(long, env = "GPUSLICE_SSO_GROUPS", default_value = "")]
    pub sso_groups: String,
    /// Local passwords: on, or off (then only --break-glass-admin may use one).
    #[arg(long, env = "GPUSLICE_LOCAL_PASSWORDS", default_value = "on", value_parser = ["on", "off"])]
    pub local_passwords: String,
    /// The one account that keeps its local password when they are off.
    #[arg(long, env = "GPUSLICE_BREAK_GLASS_ADMIN")]
    pub break_glass_admin: Option<String>,
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
    /// How time-sliced shares are enforced: auto (at the kernel-launch
    /// layer where the shim is installed, else the freezer), launch (the
    /// shim is required) or freezer (cgroup freezer alone).
    #[arg(long, env = "GPUSLICE_TIMESLICE_ENFORCE", default_value = "auto", value_parser = ["auto", "launch", "freezer"])]
    pub timeslice_enforce: String,
    /// The launch shim `gpuslice exec` preloads (default: libgpuslice_shim.so
    /// beside the gpuslice binary, or in /usr/lib/gpuslice).
    #[arg(long, env = "GPUSLICE_CUDA_SHIM")]
    pub cuda_shim: Option<PathBuf>,
    /// GPUs (uuids, comma separated, or all) whose time-sliced shares run
    /// under NVIDIA MPS instead (same-user inference; one fault domain).
    #[arg(long, env = "GPUSLICE_MPS_GPUS")]
    pub mps_gpus: Option<String>,
    /// Where shares' launch regions live (default: shares/ beside the exec
    /// socket); the node's users must be able to reach it.
    #[arg(long, env = "GPUSLICE_SHARE_DIR")]
    pub share_dir: Option<PathBuf>,
    /// What a node does by itself when a security incident on it reaches
    /// the threshold: none, end-intruders, freeze-shares (or both, comma
    /// separated). Every response is audited.
    #[arg(long, env = "GPUSLICE_SECURITY_RESPONSE", default_value = "none")]
    pub security_response: String,
    /// Seconds processes on a device get between SIGTERM and SIGKILL when its booking ends.
    #[arg(long, env = "GPUSLICE_GRACE_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub grace_secs: u64,
    /// Length of a metering interval in seconds (one usage row per booking per interval).
    #[arg(long, env = "GPUSLICE_METER_INTERVAL_SECS", default_value_t = 60, value_parser = clap::value_parser!(i64).range(1..=3600))]
    pub meter_interval_secs: i64,
    /// Usage rows the local spool holds while PostgreSQL is unreachable.
    #[arg(long, env = "GPUSLICE_SPOOL_MAX_ROWS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(100..=100_000_000))]
    pub spool_max_rows: u64,
    /// Seconds between telemetry samples of every GPU and booking (and
    /// between alert evaluations).
    #[arg(long, env = "GPUSLICE_TELEMETRY_INTERVAL_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub telemetry_interval_secs: u64,
    /// A booking's device under this utilisation (%) with no processes is
    /// idle (for tenants with an idle policy).
    #[arg(long, env = "GPUSLICE_IDLE_THRESHOLD_PCT", default_value_t = 5.0)]
    pub idle_threshold_pct: f32,
    /// Lower time-sliced shares that stay under 10 % busy for 30 minutes to
    /// low priority (restored once busy again; recorded on /admin/optimizer).
    #[arg(long, env = "GPUSLICE_OPTIMIZER_LOWER_IDLE_SHARES")]
    pub optimizer_lower_idle_shares: bool,
    /// Hours raw telemetry samples are kept (5-minute rollups stay longer).
    #[arg(long, env = "GPUSLICE_TELEMETRY_RAW_HOURS", default_value_t = 48, value_parser = clap::value_parser!(i64).range(1..=8760))]
    pub telemetry_raw_hours: i64,
    /// Months of per-interval usage rows kept (the current month counts;
    /// whole monthly partitions are dropped); 0 keeps all. Daily rollups,
    /// which every report reads, are kept forever.
    #[arg(long, env = "GPUSLICE_USAGE_RETENTION_MONTHS", default_value_t = 13, value_parser = clap::value_parser!(i32).range(0..=1200))]
    pub usage_retention_months: i32,
    /// Days the 5-minute telemetry rollups are kept.
    #[arg(long, env = "GPUSLICE_TELEMETRY_ROLLUP_DAYS", default_value_t = 90, value_parser = clap::value_parser!(i64).range(1..=3650))]
    pub telemetry_rollup_days: i64,
    /// SMTP server for e-mail notifications: smtp://host:25,
    /// smtps://user:pass@host:465 (unset: no e-mail).
    #[arg(long, env = "GPUSLICE_SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<String>,
    /// Sender of notification e-mails ("gpuslice <gpus@example.edu>").
    #[arg(long, env = "GPUSLICE_MAIL_FROM")]
    pub mail_from: Option<String>,
    /// Slack/Mattermost-compatible incoming webhook for alerts (unset: none).
    #[arg(long, env = "GPUSLICE_ALERT_WEBHOOK_URL", hide_env_values = true)]
    pub alert_webhook_url: Option<String>,
    /// Seconds after which a notification whose sender stopped mid-send
    /// is marked unconfirmed (and not sent again on its own).
    #[arg(long, env = "GPUSLICE_NOTIFY_LEASE_SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub notify_lease_secs: u64,
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
    /// Telemetry: worker cost of sampling a node (against one row per
    /// statement, in the same run), a day's rollup and `/metrics` for a
    /// large fleet. Runs in a scratch database it creates and drops on the
    /// server DATABASE_URL (or the embedded cluster) points at.
    Telemetry {
        /// GPUs of the sampled node (H100-80GB in MIG mode).
        #[arg(long, default_value_t = 64)]
        gpus: usize,
        /// 1g.10gb instances per sampled GPU, each held by a booking (1 to 7).
        #[arg(long, default_value_t = 7)]
        instances: usize,
        /// Sampling rounds timed.
        #[arg(long, default_value_t = 30)]
        rounds: usize,
        /// GPUs of the fleet for the rollup and `/metrics` figures.
        #[arg(long, default_value_t = 1000)]
        fleet: usize,
        /// Seconds between the day's samples of the fleet.
        #[arg(long, default_value_t = 10)]
        interval_secs: u64,
    },
    /// Fills the database DATABASE_URL (or the data directory's embedded
    /// cluster) points at with about N usage rows of realistic ended
    /// bookings over the M months ending now, rollups exact (for the
    /// history benchmarks in BENCHMARKS.md). Adds to what is there.
    History {
        /// Usage rows to make (one per booking-minute).
        #[arg(long)]
        rows: u64,
        /// Months of history, ending now.
        #[arg(long, default_value_t = 12)]
        months: u32,
        /// Seed of the bookings' sizes, lengths and times.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Time-slice scheduler: tick cost with 1,000 shares; as root, the
    /// achieved 4:2:1 ratio of real busy processes and the switch latency.
    Scheduler {
        /// Seconds each real-process run lasts.
        #[arg(long, default_value_t = 15)]
        secs: u64,
    },
    /// Time-sliced shares at the launch layer on the stand-in libcuda: the
    /// 4:2:1 split of 3 and 10 busy shares with no control, the freezer
    /// (as root) and the shim, and the shim's cost per launch.
    Launch {
        /// Where cuda-burn, libgpuslice_shim.so and libcuda.so.1 were built.
        #[arg(long, default_value = "target/release")]
        parts: PathBuf,
        /// Seconds each split is measured.
        #[arg(long, default_value_t = 15)]
        secs: u64,
    },
    /// MIG benchmark: H100-80GB fleet, request stream from the trace's pods.
    Mig(MigBench),
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

/// `gpuslice bench mig`'s options.
#[derive(Debug, Args)]
pub struct MigBench {
    /// Pod list CSV with creation_time and deletion_time.
    #[arg(long)]
    pub pods: PathBuf,
    /// Number of H100-80GB GPUs (the default trace peaks at 472 compute
    /// slices, about 67 GPUs: 50 is heavy load).
    #[arg(long, default_value_t = 50)]
    pub gpus: usize,
    /// Arrivals this many times faster (durations unchanged): more
    /// load on the same fleet. 1 replays the trace's own times.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Percentage of requests booked ahead (1–72 h before their start);
    /// adds a run of the default policy that moves scheduled bookings
    /// to let requests in.
    #[arg(long, default_value_t = 0.0)]
    pub advance: f64,
    /// Each seed replays a bootstrap of the trace (as many pods, drawn
    /// with replacement) instead of the trace itself: independent
    /// streams of the same kind, for comparing policies in expectation.
    #[arg(long)]
    pub resample: bool,
    /// Moves each pod's arrival a uniform 0 to this many whole seconds
    /// later, in replay time (seeded; its length kept): the same trace
    /// with arrivals shifted by less than a person would notice, to see
    /// whether one stream's outcome is the policy's or its timing's.
    #[arg(long, default_value_t = 0)]
    pub jitter_s: u32,
    /// The profile mix the default policy keeps room for.
    #[arg(long, value_enum, default_value_t = crate::bench::mig::MixSource::Recent)]
    pub mix: crate::bench::mig::MixSource,
    /// Replays first-fit and a policy that ranks placements by these
    /// terms in order, and nothing else (named "key ORDER" in results):
    /// ext (how much longer the booking keeps the GPU busy), overhang
    /// (how long the GPU's bookings outlast it), loss (of the profile
    /// mix's capacity), free (fewest free slices), mostfree, idx; the
    /// GPU's index and the slot break the remaining ties. "ext,loss" is
    /// the default policy's order.
    #[arg(long, value_name = "ORDER")]
    pub key: Option<String>,
    /// Splits each policy's refusals into fragmentation's (packing every
    /// booking present again, largest first, would have held the request
    /// too) and capacity's; packs the fleet again at each refusal, about
    /// 3–4 times the run's time.
    #[arg(long)]
    pub causes: bool,
    /// Replays first-fit (plain) and the default policy behind an admission
    /// rule, and nothing else (named "gpuslice admit KEEP,QUANTILE[,all]" in
    /// results; not with --key, --advance or --causes): a request that
    /// fits is refused when its placement takes a GPU free over its
    /// window, leaving fewer than KEEP such GPUs, and it is shorter than
    /// the QUANTILE (0 to 1) of the durations of the requests made in the
    /// last 30 days of replay time (none refused before there are 20).
    /// Whole-GPU requests only, or every profile with ",all". To measure
    /// what refusing requests that fit buys; gpuslice does not book with
    /// it.
    #[arg(long, value_name = "KEEP,QUANTILE[,all]")]
    pub admit: Option<String>,
    #[arg(long, default_value = "42")]
    pub seeds: String,
    #[arg(long)]
    pub json: bool,
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
    /// Change a tenant's idle policy.
    Edit(TenantEditArgs),
}

/// A tenant's idle policy as flags.
#[derive(Debug, Args, Default, Clone)]
pub struct IdleArgs {
    /// Minutes without work on a booking's GPU before its owner is warned
    /// (0: idle reclaim off).
    #[arg(long, allow_hyphen_values = true)]
    pub idle_after_minutes: Option<String>,
    /// Minutes the owner has to answer "still working" after the warning.
    #[arg(long, allow_hyphen_values = true)]
    pub idle_grace_minutes: Option<String>,
    /// notify or release: what follows an unanswered warning.
    #[arg(long)]
    pub idle_action: Option<String>,
}

#[derive(Debug, Args)]
pub struct TenantEditArgs {
    #[arg(long)]
    pub slug: String,
    #[command(flatten)]
    pub idle: IdleArgs,
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
    #[command(flatten)]
    pub idle: IdleArgs,
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

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Stage what a GPU reports (each value replaces the modelled one).
    Set(SimSetArgs),
    /// The driver reports an XID error on a GPU.
    Xid {
        #[arg(long)]
        node: String,
        #[arg(long)]
        gpu: u32,
        /// The XID code (e.g. 79: fallen off the bus; 48: double-bit ECC).
        #[arg(long)]
        code: u64,
    },
    /// A process starts using a GPU or MIG device.
    Process {
        #[arg(long)]
        node: String,
        /// The GPU's or MIG device's uuid.
        #[arg(long)]
        device: String,
        #[arg(long)]
        pid: u32,
        /// GPU memory it uses.
        #[arg(long, default_value_t = 1024)]
        used_mib: u64,
    },
    /// The GPU reports its modelled values again (staged values, lost and
    /// undelivered events cleared).
    Clear {
        #[arg(long)]
        node: String,
        #[arg(long)]
        gpu: u32,
    },
}

#[derive(Debug, Args)]
pub struct SimSetArgs {
    #[arg(long)]
    pub node: String,
    /// The GPU's index on the node.
    #[arg(long)]
    pub gpu: u32,
    /// Degrees Celsius.
    #[arg(long)]
    pub temperature: Option<u32>,
    /// Percent.
    #[arg(long)]
    pub utilization: Option<u32>,
    /// Watts.
    #[arg(long)]
    pub power: Option<f64>,
    #[arg(long)]
    pub memory_used_mib: Option<u64>,
    /// Uncorrectable ECC errors since the last reset.
    #[arg(long)]
    pub ecc_uncorrectable: Option<u64>,
    /// The GPU falls off the bus.
    #[arg(long, conflicts_with = "found")]
    pub lost: bool,
    /// A lost GPU answers again.
    #[arg(long)]
    pub found: bool,
}

#[derive(Debug, Subcommand)]
pub enum AlertCommand {
    /// List the alert rules.
    Rules,
    /// Change an alert rule.
    Rule {
        /// The rule's name (see `gpuslice alert rules`).
        name: String,
        #[arg(long)]
        threshold: Option<String>,
        /// How long the condition must hold, in seconds.
        #[arg(long)]
        for_secs: Option<String>,
        /// info, warning, critical or high.
        #[arg(long)]
        severity: Option<String>,
        #[arg(long, conflicts_with = "disable")]
        enable: bool,
        #[arg(long)]
        disable: bool,
    },
}

/// An address or a CIDR block (`10.0.0.0/8`, `::1`).
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    let s = s.trim();
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s:?} is not an IP address or CIDR block (e.g. 10.0.0.0/8)"))
}
