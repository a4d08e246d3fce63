//! Device isolation with real processes in real cgroups (as root): a
//! process in a booking's group opens its own device nodes (ENXIO: the
//! simulated nodes have no driver behind them) and gets EPERM on every
//! other NVIDIA node. Both mechanisms run where the kernel offers them
//! (the v1 `devices` controller; a v2 BPF device program); a path this
//! machine cannot take is skipped loudly with the reason.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuslice::sched::cgroup::Layout;
use gpuslice::sched::devices::{self, apply_v2, DeviceNode, Mechanism, NodeDevices};

/// A directory removed when dropped.
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn skip(test: &str, why: &str) {
    common::skip_or_require(&format!("isolation test {test}"), why);
}

/// The layout with a private prefix and simulated device files, or `None`
/// (and a loud message).
fn setup(test: &str) -> Option<(Layout, NodeDevices, Dir)> {
    if !nix::unistd::Uid::effective().is_root() {
        skip(test, "not running as root");
        return None;
    }
    let prefix = format!("gpuslice-iso-{}-{test}", std::process::id());
    let Some(layout) = Layout::detect(Path::new("/sys/fs/cgroup"), &prefix) else {
        skip(
            test,
            "no cgroup hierarchy with a freezer under /sys/fs/cgroup",
        );
        return None;
    };
    let dir = Dir(std::env::temp_dir().join(format!("gpuslice-iso-{}-{test}", std::process::id())));
    let Some(nd) = devices::sim::prepare(&dir.0, "node-a", 2) else {
        skip(test, "no free character-device majors for simulated GPUs");
        return None;
    };
    let ctl = nd.dev_dir.join("nvidiactl");
    if !ctl.exists() {
        skip(
            test,
            "cannot make device files here (mknod refused: a nodev file system?)",
        );
        return None;
    }
    Some((layout, nd, dir))
}

/// What opening each path gives a process in `group` (read access):
/// `OK`, or the error text.
fn opens_in(group: &gpuslice::sched::cgroup::Group, paths: &[String]) -> Vec<String> {
    // The shell waits for a line, so it is in the group before it opens.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"read go; for p in "$@"; do if out=$(dd if="$p" of=/dev/null count=0 2>&1); then echo OK; else echo "$out" | tail -n 1; fi; done"#)
        .arg("sh")
        .args(paths)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    group.add(child.id()).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .collect::<Vec<_>>();
    child.wait().unwrap();
    out
}

/// As [`opens_in`], for a process moved into the cgroup directory `dir`
/// (a container's group under the booking's).
fn opens_in_dir(dir: &Path, paths: &[String]) -> Vec<String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"read go; for p in "$@"; do if out=$(dd if="$p" of=/dev/null count=0 2>&1); then echo OK; else echo "$out" | tail -n 1; fi; done"#)
        .arg("sh")
        .args(paths)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .collect::<Vec<_>>();
    child.wait().unwrap();
    out
}

fn denied(line: &str) -> bool {
    line.contains("Operation not permitted")
}

fn check(
    layout: &Layout,
    nd: &NodeDevices,
    mechanism: Mechanism,
    restrict: impl Fn(&gpuslice::sched::cgroup::Group, &devices::DevicePolicy) -> std::io::Result<()>,
) {
    let mine = nd.for_device(0, Some((1, 0))).unwrap();
    let theirs = nd.for_device(1, Some((2, 0))).unwrap();
    let group = layout.create(1, None, None).unwrap();
    restrict(&group, &nd.policy(&mine)).unwrap_or_else(|e| panic!("{}: {e}", mechanism.as_str()));
    let paths = |v: &[DeviceNode]| v.iter().map(|d| d.path.clone()).collect::<Vec<_>>();
    let own = opens_in(&group, &paths(&mine));
    for (p, r) in mine.iter().zip(&own) {
        assert!(
            r.contains("No such device or address"),
            "{}: own node {} should reach the (absent) driver, got {r}",
            mechanism.as_str(),
            p.path
        );
    }
    let other: Vec<DeviceNode> = theirs.into_iter().filter(|d| !mine.contains(d)).collect();
    assert_eq!(other.len(), 3, "their GPU and two capabilities");
    let got = opens_in(&group, &paths(&other));
    for (p, r) in other.iter().zip(&got) {
        assert!(
            denied(r),
            "{}: {} should be refused, got {r}",
            mechanism.as_str(),
            p.path
        );
    }
    // Ordinary devices stay open.
    assert_eq!(opens_in(&group, &["/dev/null".to_string()]), vec!["OK"]);
    // A container started with `--cgroup-parent` at the booking's group
    // lives in a child group that its runtime tries to open up: the
    // booking's confinement still holds there.
    let child = match (mechanism, layout) {
        (
            Mechanism::V1Devices,
            Layout::V1 {
                devices: Some(d), ..
            },
        ) => d.join("booking-1/ctr"),
        _ => group.v2_dir().unwrap().join("ctr"),
    };
    std::fs::create_dir(&child).unwrap();
    match mechanism {
        // runc writes its own rules; a child keeps its parent's exceptions
        // (the kernel copies them, or refuses what the parent lacks).
        Mechanism::V1Devices => {
            let _ = std::fs::write(child.join("devices.allow"), "a *:* rwm");
            let _ = std::fs::write(child.join("devices.allow"), "c 195:* rwm");
        }
        // runc attaches its own program (ALLOW_MULTI); the parent's still runs.
        _ => apply_v2(&child, &nd.policy(&[mine.clone(), other.clone()].concat())).unwrap(),
    }
    let in_child = opens_in_dir(&child, &paths(&other));
    assert_eq!(in_child.len(), other.len(), "{in_child:?}");
    assert!(
        in_child.iter().all(|r| denied(r)),
        "{}: {in_child:?}",
        mechanism.as_str()
    );
    let own_in_child = opens_in_dir(&child, &paths(&mine));
    assert_eq!(own_in_child.len(), mine.len(), "{own_in_child:?}");
    assert!(
        own_in_child
            .iter()
            .all(|r| r.contains("No such device or address")),
        "{own_in_child:?}"
    );
    std::fs::remove_dir(&child).unwrap();
    // Outside the group everything reaches the driver.
    let root = layout.create(2, None, None).unwrap();
    let free = opens_in(&root, &paths(&other));
    assert!(free.iter().all(|r| !denied(r)), "{free:?}");
    group.remove(Duration::from_millis(100)).unwrap();
    root.remove(Duration::from_millis(100)).unwrap();
    layout.remove_prefix();
}

#[test]
fn v1_devices_controller_confines_a_booking() {
    let Some((layout, nd, _dir)) = setup("v1") else {
        return;
    };
    let Layout::V1 {
        devices: Some(_), ..
    } = &layout
    else {
        skip(
            "v1",
            "this host has no cgroup v1 devices controller (pure v2)",
        );
        return;
    };
    check(&layout, &nd, Mechanism::V1Devices, |g, p| {
        assert_eq!(g.restrict_devices(p)?, Mechanism::V1Devices);
        Ok(())
    });
}

#[test]
fn v2_bpf_device_program_confines_a_booking() {
    let Some((layout, nd, _dir)) = setup("v2") else {
        return;
    };
    if layout.group(0).v2_dir().is_none() {
        skip("v2", "this host has no cgroup v2 hierarchy");
        return;
    }
    // Only the BPF program, even where the v1 controller exists too, so
    // this test sees the v2 mechanism alone.
    let probe = layout.create(0, None, None).unwrap();
    let probe_dir = probe.v2_dir().unwrap();
    let attached = apply_v2(&probe_dir, &nd.policy(&[]));
    probe.remove(Duration::ZERO).unwrap();
    if let Err(e) = attached {
        skip(
            "v2",
            &format!("the kernel refused a BPF device program: {e}"),
        );
        layout.remove_prefix();
        return;
    }
    check(&layout, &nd, Mechanism::V2Bpf, |g, p| {
        apply_v2(&g.v2_dir().unwrap(), p)
    });
}

mod common;

use common::{Killed, TestApp, WorkerProcess};

/// A MIG node's worker process (one H100, so two bookings have distinct
/// capability files), with the owner's account linked to `nobody`.
async fn mig_node(tag: &str) -> (TestApp, WorkerProcess, Killed, gpuslice::booking::Requester) {
    common::mig_worker(&format!("iso{tag}"), &[]).await
}

async fn mig_booking(app: &TestApp, who: &gpuslice::booking::Requester) -> i64 {
    common::book_active(app, who, "mig", "1g.10gb").await
}

async fn nodes_of(app: &TestApp, id: i64) -> Vec<String> {
    let b = gpuslice::db::bookings::get(&app.pool, id).await.unwrap();
    gpuslice::web::api::views::BookingView::from(&b).device_nodes
}

fn exec_as_nobody(node: &WorkerProcess, booking: i64, paths: &[String]) -> Vec<String> {
    let script = r#"for p in "$@"; do if out=$(dd if="$p" of=/dev/null count=0 2>&1); then echo OK; else echo "$out" | tail -n 1; fi; done"#;
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["exec", &booking.to_string(), "--socket"])
        .arg(node.socket())
        .args(["--", "sh", "-c", script, "sh"])
        .args(paths)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The issue's test: a process joined to booking A with `gpuslice exec`
/// gets EPERM on booking B's device files and reaches the (absent) driver
/// on A's.
#[tokio::test]
async fn exec_confines_a_booking_to_its_own_device_files() {
    if !nix::unistd::Uid::effective().is_root() {
        skip("exec", "not running as root");
        return;
    }
    let (app, node, _worker, who) = mig_node("a").await;
    let a = mig_booking(&app, &who).await;
    let b = mig_booking(&app, &who).await;
    let (mine, theirs) = (nodes_of(&app, a).await, nodes_of(&app, b).await);
    if mine.is_empty() {
        skip(
            "exec",
            "the worker confines no devices here (no cgroups, or no device numbering)",
        );
        return;
    }
    assert_eq!(mine.len(), 6, "{mine:?}");
    assert!(mine.iter().any(|p| p.ends_with("/nvidiactl")));
    assert!(mine[0].starts_with(node.dir.join("sim/dev").to_str().unwrap()));
    let other: Vec<String> = theirs
        .iter()
        .filter(|p| !mine.contains(p))
        .cloned()
        .collect();
    let a_only: Vec<String> = mine
        .iter()
        .filter(|p| !theirs.contains(p))
        .cloned()
        .collect();
    assert_eq!(a_only.len(), 2, "A's two capability files: {a_only:?}");
    assert_eq!(other.len(), 2, "B's two capability files: {other:?}");
    for (p, r) in mine.iter().zip(exec_as_nobody(&node, a, &mine)) {
        assert!(r.contains("No such device or address"), "{p}: {r}");
    }
    for (p, r) in other.iter().zip(exec_as_nobody(&node, a, &other)) {
        assert!(denied(&r), "{p}: {r}");
    }
    // And the other way round: B reaches its own files and not A's.
    for (p, r) in other.iter().zip(exec_as_nobody(&node, b, &other)) {
        assert!(r.contains("No such device or address"), "{p}: {r}");
    }
    for (p, r) in a_only.iter().zip(exec_as_nobody(&node, b, &a_only)) {
        assert!(denied(&r), "{p}: {r}");
    }
    // The booking page lists them.
    let page = app.signed_in("ana@uni.edu").await;
    let html = page
        .get(app.url(&format!("/bookings/{a}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("id=\"device-nodes\""), "{html}");
    assert!(html.contains(&mine[3]));

    // A container goes under the booking's own group, the one that
    // confines it (checked above for a child group): the arguments name
    // a group that exists on this node.
    let view = {
        let b = gpuslice::db::bookings::get(&app.pool, a).await.unwrap();
        gpuslice::web::api::views::BookingView::from(&b)
    };
    let c = view
        .container
        .expect("an active booking says how to run a container");
    assert!(
        c.cgroup_parent.ends_with(&format!("/booking-{a}")),
        "{}",
        c.cgroup_parent
    );
    assert!(c.docker_args[0] == format!("--cgroup-parent={}", c.cgroup_parent));
    assert!(c.docker_args[2].contains(view.device_uuid.as_deref().unwrap()));
    let exists = ["", "devices", "freezer", "unified"].iter().any(|h| {
        Path::new("/sys/fs/cgroup")
            .join(h)
            .join(c.cgroup_parent.trim_start_matches('/'))
            .is_dir()
    });
    assert!(exists, "no cgroup {} on this node", c.cgroup_parent);
    assert!(html.contains("--cgroup-parent="), "{html}");
    assert!(html.contains("apptainer exec --nv"), "{html}");
    // Only the line is checked: no test runs Apptainer.
    common::skipped(
        "Apptainer inside a booking",
        "no test runs apptainer (Debian 12 does not package it); only the booking page's `gpuslice exec ID -- apptainer exec --nv` line is checked",
    );
}

/// The pid-reuse race: a child connects to the socket and exits; its
/// parent sends the request on the inherited connection. The worker
/// refuses (the pid no longer names the caller) and moves nobody.
#[tokio::test]
async fn exec_refuses_a_connection_whose_process_has_gone() {
    if !nix::unistd::Uid::effective().is_root() {
        skip("pid race", "not running as root");
        return;
    }
    let (app, node, _worker, who) = mig_node("b").await;
    let a = mig_booking(&app, &who).await;
    let sock = node.socket();
    let path = std::ffi::CString::new(sock.to_str().unwrap()).unwrap();
    // SAFETY: plain socket calls on descriptors this test owns; the child
    // only connects and exits.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in path.as_bytes().iter().enumerate() {
        addr.sun_path[i] = *b as libc::c_char;
    }
    let child = unsafe { libc::fork() };
    if child == 0 {
        let rc = unsafe {
            libc::connect(
                fd,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        unsafe { libc::_exit(if rc == 0 { 0 } else { 1 }) };
    }
    let mut status = 0;
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert_eq!(status, 0, "the child connected");
    use std::os::fd::FromRawFd;
    let mut stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    stream
        .write_all(format!("{{\"booking\": {a}}}\n").as_bytes())
        .unwrap();
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":false"), "{line}");
    assert!(line.contains("has exited"), "{line}");
    // Nobody was moved: the group is empty, and this test process (which
    // sent the request) is not in it.
    let l = gpuslice::sched::shares::layout_for(&node.name).expect("root has cgroups");
    assert!(
        l.group(a).pids().is_empty(),
        "nobody was moved into the booking"
    );
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert!(!own.contains(&format!("booking-{a}")), "{own}");
}

/// `gpu-check` tells a locked-down node from an open one by trying: a
/// probe in the login cgroup opens the GPU files.
#[test]
fn gpu_check_reports_whether_the_node_is_locked_down() {
    let Some((_layout, nd, _dir)) = setup("lockdown") else {
        return;
    };
    let devices = Path::new("/sys/fs/cgroup/devices");
    if !devices.join("cgroup.procs").is_file() {
        skip(
            "lockdown",
            "no cgroup v1 devices controller to stand for a locked login slice",
        );
        return;
    }
    let run = |cgroup: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(["gpu-check", "--lockdown-only", "--dev-dir"])
            .arg(&nd.dev_dir)
            .args(["--probe-cgroup", cgroup])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // A login slice that denies NVIDIA's majors, as docs/operations.md
    // sets one up, and one that does not.
    let locked = format!("gpuslice-iso-{}-login-locked", std::process::id());
    let open = format!("gpuslice-iso-{}-login-open", std::process::id());
    for name in [&locked, &open] {
        std::fs::create_dir_all(devices.join(name)).unwrap();
    }
    let deny = nd.policy(&[]).v1_deny();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(devices.join(&locked).join("devices.deny"))
        .unwrap();
    for line in deny {
        f.write_all(line.as_bytes()).unwrap();
    }
    let report = run(&locked);
    assert!(report.contains("verdict: locked down"), "{report}");
    assert!(
        report.contains("refused (Operation not permitted)"),
        "{report}"
    );
    let report = run(&open);
    assert!(report.contains("verdict: NOT locked down"), "{report}");
    assert!(report.contains("(every account may open it)"), "{report}");
    for name in [&locked, &open] {
        let _ = std::fs::remove_dir(devices.join(name));
    }
}

/// `exec --isolate pid`: the command is alone in its PID namespace and
/// its `/dev` holds the pseudo-devices and the booking's files only.
#[tokio::test]
async fn exec_isolate_pid_gives_a_private_pid_space_and_dev() {
    if !nix::unistd::Uid::effective().is_root() {
        skip("isolate", "not running as root");
        return;
    }
    let (app, node, _worker, who) = mig_node("c").await;
    let a = mig_booking(&app, &who).await;
    let mine = nodes_of(&app, a).await;
    if mine.is_empty() {
        skip("isolate", "the worker confines no devices here");
        return;
    }
    let script = r#"echo "pid=$$"; ls /dev; ls /dev/nvidia-caps; echo "procs=$(ls /proc | grep -c '^[0-9]')"; dd if=/dev/nvidia0 of=/dev/null count=0 2>&1 | tail -n 1"#;
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["exec", "--isolate", "pid", &a.to_string(), "--socket"])
        .arg(node.socket())
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("cannot make the namespaces") {
        skip(
            "isolate",
            &format!("this machine refuses the namespaces: {stderr}"),
        );
        return;
    }
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("pid=2\n"),
        "PID 1 is gpuslice's init: {stdout}"
    );
    let procs: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("procs="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    // init, the shell, and the subshell, ls and grep that count.
    assert!(procs <= 6, "only the namespace's processes: {stdout}");
    for want in [
        "null",
        "urandom",
        "nvidiactl",
        "nvidia0",
        "nvidia-uvm",
        "pts",
    ] {
        assert!(
            stdout.lines().any(|l| l == want),
            "{want} in /dev: {stdout}"
        );
    }
    for unwanted in ["vda", "sda", "mem", "kmsg"] {
        assert!(
            !stdout.lines().any(|l| l == unwanted),
            "{unwanted} in /dev: {stdout}"
        );
    }
    let caps: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("nvidia-cap") && *l != "nvidia-caps")
        .collect();
    assert_eq!(
        caps.len(),
        2,
        "the booking's two capability files: {stdout}"
    );
    assert!(
        stdout.contains("No such device or address"),
        "its GPU reaches the (absent) driver: {stdout}"
    );
}
