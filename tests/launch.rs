//! Time-sliced shares enforced at the kernel-launch layer, against a real
//! `gpuslice worker` and the stand-in `libcuda.so.1` (one simulated GPU
//! for the machine, launches queued asynchronously as on hardware):
//! three shares each running a kernel-launching program under
//! `gpuslice exec` split the GPU 4:2:1 with the shim and about evenly
//! without it; the QoS ledger counts the GPU time the shim measured, not CPU
//! time; an allocation past the share's memory fails with CUDA's
//! out-of-memory error; a process on the share's GPU without the shim is
//! found and its share frozen. Without root or cgroups the tests say so
//! loudly and skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{booking_status, wait_for, Killed, TestApp, WorkerProcess};
use gpuslice::booking::Requester;

struct Node {
    worker: WorkerProcess,
    parts: PathBuf,
    /// The stand-in's machine-wide state (a private simulated GPU).
    state: PathBuf,
}

impl Node {
    fn new(app: &TestApp, tag: &str) -> Node {
        let name = format!("l{}{tag}", std::process::id());
        let fleet = format!("[[node]]\nname = \"{name}\"\n[[node.gpu]]\nmodel = \"L40S-48GB\"\nmode = \"timeslice\"\ncount = 1\nmax_shares = 4\n");
        let worker = WorkerProcess::new(app, "launch", &name, &fleet);
        let state = worker.dir.join("cuda-standin");
        Node {
            worker,
            parts: common::cuda_parts(),
            state,
        }
    }

    fn socket(&self) -> PathBuf {
        self.worker.socket()
    }

    /// The worker, enforcing shares as `mode` says (launch or freezer).
    fn start(&self, mode: &str) -> Killed {
        let mut cmd = self.worker.command();
        cmd.env("GPUSLICE_GRACE_SECS", "1")
            .env("GPUSLICE_TIMESLICE_ENFORCE", mode)
            .env("GPUSLICE_CUDA_SHIM", self.parts.join("libgpuslice_shim.so"))
            .env(gpuslice_cuda::standin::ENV_STATE, &self.state);
        Killed(cmd.spawn().unwrap())
    }

    /// `gpuslice exec BOOKING -- PROGRAM...` with the stand-in driver on
    /// the library path; `program[0]` "cuda-burn" is the built one.
    fn exec(&self, booking: i64, program: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
        let burn = self.parts.join("cuda-burn");
        cmd.args(["exec", &booking.to_string(), "--socket"])
            .arg(self.socket())
            .arg("--");
        for a in program {
            if *a == "cuda-burn" {
                cmd.arg(&burn);
            } else {
                cmd.arg(a);
            }
        }
        cmd.env("LD_LIBRARY_PATH", &self.parts)
            .env(gpuslice_cuda::standin::ENV_STATE, &self.state)
            .env_remove("LD_PRELOAD")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn layout(&self) -> Option<gpuslice::sched::cgroup::Layout> {
        gpuslice::sched::shares::layout_for(&self.worker.name)
    }

    /// GPU time each process's launches took so far, ns.
    fn gpu_ns(&self, pids: &[u32]) -> Vec<u64> {
        let live = gpuslice_cuda::standin::read_at(&self.state).unwrap_or_default();
        pids.iter()
            .map(|p| live.iter().find(|v| v.pid == *p).map_or(0, |v| v.gpu_ns))
            .collect()
    }
}

fn skip_without_cgroups(node: &Node, test: &str) -> bool {
    common::skip_without_cgroups(
        node.layout().is_some(),
        &format!("launch-layer test {test}"),
    )
}

async fn setup(tag: &str) -> (TestApp, Node, Requester) {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    sqlx::query("UPDATE tenants SET max_active_bookings = 10, max_gpu_memory_gib = 100, max_compute_slices = 20")
        .execute(&app.pool)
        .await
        .unwrap();
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let node = Node::new(&app, tag);
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    (app, node, who)
}

async fn active(app: &TestApp, ids: &[i64]) {
    for id in ids {
        wait_for("active", || async {
            booking_status(app, *id).await == "active"
        })
        .await;
    }
}

/// Parts of the GPU the processes `pids` took over `secs` seconds, after
/// `warm` seconds to settle.
async fn split(node: &Node, pids: &[u32], warm: u64, secs: u64) -> Vec<f64> {
    tokio::time::sleep(Duration::from_secs(warm)).await;
    let before = node.gpu_ns(pids);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let after = node.gpu_ns(pids);
    let used: Vec<f64> = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b) as f64)
        .collect();
    let total: f64 = used.iter().sum();
    assert!(total > 0.0, "the shares launched nothing");
    used.iter().map(|u| u / total).collect()
}

fn kill_all(procs: &mut [Child]) {
    for p in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
}

#[tokio::test]
async fn three_shares_split_4_2_1_with_the_shim_and_evenly_without_it() {
    let (app, node, who) = setup("r").await;
    if skip_without_cgroups(&node, "4:2:1") {
        return;
    }
    let layout = node.layout().unwrap();
    // Every share is promised half the GPU: the normal and low ones fall
    // short, which the ledger records from the GPU time the shim measured.
    sqlx::query("UPDATE tenants SET guaranteed_share_pct = 50")
        .execute(&app.pool)
        .await
        .unwrap();
    let worker = node.start("launch");
    common::gpus_seen(&app, 1).await;
    let mut ids = Vec::new();
    for p in ["high", "normal", "low"] {
        ids.push(common::timeslice_share(&app, &who, 8, p).await);
    }
    active(&app, &ids).await;
    // Busy programs that synchronise every 8 launches (a blocking sync,
    // as a training loop's does): they use the GPU, hardly any CPU.
    let burn = [
        "cuda-burn",
        "--seconds",
        "60",
        "--kernel-us",
        "500",
        "--sync-every",
        "8",
    ];
    let mut procs: Vec<Child> = ids
        .iter()
        .map(|id| node.exec(*id, &burn).spawn().unwrap())
        .collect();
    let pids: Vec<u32> = procs.iter().map(Child::id).collect();
    let cpu_before: Vec<u64> = ids.iter().map(|id| layout.group(*id).cpu_ns()).collect();
    let gpu_before = node.gpu_ns(&pids);
    let shim = split(&node, &pids, 4, 15).await;
    eprintln!("launch shim: GPU parts {shim:?} (4:2:1 is 0.571, 0.286, 0.143)");
    for (got, want) in shim.iter().zip([4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
        assert!(
            (got - want).abs() / want < 0.10,
            "not 4:2:1 within 10 %: {shim:?}"
        );
    }
    // What the scheduler counted is GPU time: the processes' CPU time is a
    // small fraction of it, so a CPU-time ledger would see idle shares.
    let cpu: u64 = ids
        .iter()
        .zip(&cpu_before)
        .map(|(id, b)| layout.group(*id).cpu_ns().saturating_sub(*b))
        .sum();
    let gpu: u64 = node
        .gpu_ns(&pids)
        .iter()
        .zip(&gpu_before)
        .map(|(a, b)| a.saturating_sub(*b))
        .sum();
    eprintln!(
        "CPU time {} ms against GPU time {} ms",
        cpu / 1_000_000,
        gpu / 1_000_000
    );
    assert!(
        cpu * 4 < gpu,
        "the programs are GPU-bound: CPU {cpu} ns, GPU {gpu} ns"
    );
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let b: serde_json::Value = client
        .get(app.url(&format!("/api/v1/bookings/{}", ids[0])))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let achieved = b["scheduler"]["achieved_share_pct"].as_f64().unwrap_or(0.0);
    assert!(
        (45.0..=70.0).contains(&achieved),
        "the high share achieved about 4/7 of the GPU by the shim's measure: {b}"
    );
    wait_for("the low share's violation in the QoS ledger", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM qos_events WHERE kind = 'violation' AND booking_id = $1",
        )
        .bind(ids[2])
        .fetch_one(&app.pool)
        .await
        .unwrap()
            >= 1
    })
    .await;
    kill_all(&mut procs);
    drop(worker);

    // The same programs without the shim or a scheduler: they race for
    // the simulated GPU and split it about evenly.
    let mut procs: Vec<Child> = (0..3)
        .map(|_| {
            Command::new(node.parts.join("cuda-burn"))
                .args(&burn[1..])
                .env("LD_LIBRARY_PATH", &node.parts)
                .env(gpuslice_cuda::standin::ENV_STATE, &node.state)
                .env_remove("LD_PRELOAD")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = procs.iter().map(Child::id).collect();
    let free = split(&node, &pids, 4, 15).await;
    eprintln!("without the shim: GPU parts {free:?} (even is 0.333 each)");
    for got in &free {
        assert!((0.25..=0.42).contains(got), "about even: {free:?}");
    }
    kill_all(&mut procs);
    layout.remove_prefix();
}

/// Runs `cuda-burn ARGS` in booking `id` and returns its JSON line.
fn burn_once(node: &Node, id: i64, args: &[&str]) -> serde_json::Value {
    let mut program = vec!["cuda-burn"];
    program.extend_from_slice(args);
    let out = node.exec(id, &program).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn state_of(path: &Path) -> Vec<gpuslice_cuda::standin::ProcView> {
    gpuslice_cuda::standin::read_at(path).unwrap_or_default()
}

#[tokio::test]
async fn memory_is_capped_at_allocation_and_a_process_without_the_shim_is_frozen() {
    let (app, node, who) = setup("m").await;
    if skip_without_cgroups(&node, "memory and unshimmed") {
        return;
    }
    let layout = node.layout().unwrap();
    let worker = node.start("launch");
    common::gpus_seen(&app, 1).await;
    let id = common::timeslice_share(&app, &who, 8, "normal").await;
    let other = common::timeslice_share(&app, &who, 8, "normal").await;
    active(&app, &[id, other]).await;

    // 9,000 MiB of an 8 GiB share: CUDA's out-of-memory error from the
    // allocation itself (the simulated GPU has 48 GiB free).
    let over = burn_once(&node, id, &["--alloc-mib", "9000"]);
    assert_eq!(over["alloc"], "out_of_memory", "{over}");
    let within = burn_once(&node, id, &["--alloc-mib", "6000"]);
    assert_eq!(within["alloc"], "ok", "{within}");

    // A container of the share gets the shim and its regions.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["exec", &other.to_string(), "--docker-args", "--socket"])
        .arg(node.socket())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docker = String::from_utf8_lossy(&out.stdout).to_string();
    let parent = format!(
        "--cgroup-parent=/gpuslice-{}/booking-{other}",
        node.worker.name
    );
    assert!(docker.contains(&parent), "{docker}");
    assert!(
        docker.contains("-e LD_PRELOAD=/usr/lib/gpuslice/libgpuslice_shim.so"),
        "{docker}"
    );
    assert!(docker.contains(&format!("{other}.control:")), "{docker}");
    assert!(docker.contains("GPUSLICE_SHARE_REPORT="), "{docker}");
    let page = app
        .text(
            &app.signed_in("ana@uni.edu").await,
            &format!("/bookings/{other}"),
        )
        .await;
    assert!(
        page.contains(&format!("$(gpuslice exec --docker-args {other})")),
        "{page}"
    );

    // A shimmed process in the other share runs on.
    let mut shimmed = Killed(
        node.exec(
            other,
            &["cuda-burn", "--seconds", "60", "--kernel-us", "200"],
        )
        .spawn()
        .unwrap(),
    );
    // The shim taken out of the environment: its launches would escape
    // the scheduler.
    let mut bare = Killed(
        node.exec(
            id,
            &[
                "env",
                "-u",
                "LD_PRELOAD",
                "cuda-burn",
                "--seconds",
                "60",
                "--kernel-us",
                "200",
            ],
        )
        .spawn()
        .unwrap(),
    );
    let bare_pid = bare.0.id();
    wait_for("the bare process on the simulated GPU", || async {
        state_of(&node.state).iter().any(|p| p.pid == bare_pid)
    })
    .await;
    wait_for("the share held by a security incident", || async {
        app.one::<bool>(&format!(
            "SELECT coalesce(bool_or(held), false) FROM security_incidents WHERE subject = 'booking:{id}'"
        ))
        .await
    })
    .await;
    let evidence: String = app
        .one(&format!(
            "SELECT e.detail FROM security_evidence e JOIN security_incidents i ON i.id = e.incident_id
             WHERE i.subject = 'booking:{id}' AND e.detector = 'unshimmed_process'"
        ))
        .await;
    assert!(evidence.contains(&bare_pid.to_string()), "{evidence}");
    let group = layout.group(id);
    wait_for("the share's group frozen", || async { group.is_frozen() }).await;
    assert!(bare.0.try_wait().unwrap().is_none(), "frozen, not ended");
    let launches = |pid: u32| {
        state_of(&node.state)
            .iter()
            .find(|p| p.pid == pid)
            .map_or(0, |p| p.launches)
    };
    // Frozen: it launches nothing more; the shimmed one keeps going and
    // its share has no incident.
    let (bare_then, shimmed_then) = (launches(bare_pid), launches(shimmed.0.id()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(launches(bare_pid), bare_then, "the frozen process launched");
    assert!(
        launches(shimmed.0.id()) > shimmed_then,
        "the shimmed share runs on"
    );
    assert_eq!(
        app.one::<i64>(&format!(
            "SELECT count(*) FROM security_incidents WHERE subject = 'booking:{other}'"
        ))
        .await,
        0
    );
    // The fleet page says how the GPU's shares are enforced.
    wait_for("the GPU's enforcement reported", || async {
        app.one::<Option<String>>("SELECT share_enforcement FROM gpus")
            .await
            .as_deref()
            == Some("launch")
    })
    .await;
    app.user("root@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("root@uni.edu").await;
    let page = app.text(&admin, "/admin/fleet").await;
    assert!(page.contains("shares enforced: launch"), "{page}");
    assert!(
        page.contains("kernel launches gated by the scheduler"),
        "{page}"
    );
    let _ = shimmed.0.kill();
    let _ = bare.0.kill();
    let _ = group.thaw();
    drop(worker);
    layout.remove_prefix();
}
