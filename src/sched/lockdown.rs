//! Is the node locked down? Booking groups confine what `gpuslice exec`
//! starts; a process started any other way lives in the login's cgroup
//! (`user.slice` under systemd) and can open every NVIDIA device file that
//! its mode lets it open. `gpuslice gpu-check` answers by looking at the
//! device files and by trying: a probe process of an unprivileged account,
//! placed in the login cgroup, opens each GPU's device file. Refused
//! (EPERM from a device cgroup, or EACCES from the file's mode) is locked
//! down; anything else reached the driver. docs/operations.md says how to
//! lock a node down.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One NVIDIA device file.
#[derive(Debug, Clone)]
pub struct FileCheck {
    pub path: PathBuf,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Readable and writable by every account (`o+rw`).
    pub open_to_all: bool,
}

/// What the probe saw opening one file.
#[derive(Debug, Clone)]
pub struct ProbeResult {
    pub path: PathBuf,
    /// `None`: opened (or reached the driver); `Some(reason)`: refused.
    pub refused: Option<String>,
    pub outcome: String,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub files: Vec<FileCheck>,
    /// Where the probe ran (cgroup paths), and as whom.
    pub probe_where: String,
    pub probe: Vec<ProbeResult>,
    /// Why the probe could not run, if it could not.
    pub probe_error: Option<String>,
}

impl Report {
    /// Locked down: there are GPU device files, the probe ran, and it was
    /// refused every one.
    pub fn locked(&self) -> bool {
        self.probe_error.is_none()
            && !self.probe.is_empty()
            && self.probe.iter().all(|p| p.refused.is_some())
    }

    pub fn verdict(&self) -> String {
        if self.files.is_empty() {
            return "no NVIDIA device files: nothing to lock down".into();
        }
        if let Some(e) = &self.probe_error {
            return format!("unknown: the probe could not run ({e})");
        }
        if self.locked() {
            "locked down: a process outside gpuslice exec cannot open the GPUs".into()
        } else {
            let open: Vec<String> = self
                .probe
                .iter()
                .filter(|p| p.refused.is_none())
                .map(|p| p.path.display().to_string())
                .collect();
            format!(
                "NOT locked down: a process outside gpuslice exec reached {}",
                open.join(", ")
            )
        }
    }
}

/// NVIDIA's device files under `dev_dir`: `nvidiactl`, `nvidiaN`, the
/// UVM files and `nvidia-caps/*`.
pub fn device_files(dev_dir: &Path) -> Vec<FileCheck> {
    let mut paths: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = std::fs::read_dir(dev_dir) {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("nvidia") && name != "nvidia-caps" {
                paths.push(e.path());
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(dev_dir.join("nvidia-caps")) {
        paths.extend(dir.flatten().map(|e| e.path()));
    }
    paths.sort();
    paths
        .into_iter()
        .filter_map(|p| {
            let m = std::fs::symlink_metadata(&p).ok()?;
            m.file_type().is_char_device().then(|| FileCheck {
                open_to_all: m.mode() & 0o006 == 0o006,
                mode: m.mode() & 0o7777,
                uid: m.uid(),
                gid: m.gid(),
                path: p,
            })
        })
        .collect()
}

/// The GPU files the probe tries: `nvidiaN` (the control file alone
/// opens no GPU).
fn gpu_files(files: &[FileCheck]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| {
            f.path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("nvidia"))
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|f| f.path.clone())
        .collect()
}

/// The directories of the login cgroup `name` in each hierarchy that
/// governs devices: the v1 `devices` controller and the v2 tree.
pub fn login_cgroups(base: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [
        base.join("devices").join(name),
        base.join("unified").join(name),
        base.join(name),
    ] {
        if dir.join("cgroup.procs").is_file() && !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// Checks the files under `dev_dir` and probes from `cgroups` as `uid`.
pub fn check(dev_dir: &Path, cgroups: &[PathBuf], uid: u32) -> Report {
    let files = device_files(dev_dir);
    let targets = gpu_files(&files);
    let probe_where = format!(
        "uid {uid} in {}",
        if cgroups.is_empty() {
            "this command's own cgroup".to_string()
        } else {
            cgroups
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        }
    );
    let mut report = Report {
        files,
        probe_where,
        probe: Vec::new(),
        probe_error: None,
    };
    if targets.is_empty() {
        return report;
    }
    match probe(&targets, cgroups, uid) {
        Ok(p) => report.probe = p,
        Err(e) => report.probe_error = Some(e),
    }
    report
}

fn probe(targets: &[PathBuf], cgroups: &[PathBuf], uid: u32) -> Result<Vec<ProbeResult>, String> {
    use std::os::unix::process::CommandExt;
    // The shell waits for a line, so it is in the cgroups before it opens.
    let script = r#"read go; for p in "$@"; do if out=$(dd if="$p" of=/dev/null count=0 2>&1); then echo OK; else echo "$out" | tail -n 1; fi; done"#;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(targets)
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the probe: {e}"))?;
    let moved = cgroups.iter().try_for_each(|c| {
        std::fs::write(c.join("cgroup.procs"), child.id().to_string())
            .map_err(|e| format!("cannot place the probe in {}: {e}", c.display()))
    });
    if let Err(e) = moved {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    child
        .stdin
        .take()
        .ok_or("no probe input")?
        .write_all(b"go\n")
        .map_err(|e| e.to_string())?;
    let lines: Vec<String> = BufReader::new(child.stdout.take().ok_or("no probe output")?)
        .lines()
        .map_while(Result::ok)
        .collect();
    let _ = child.wait();
    Ok(targets
        .iter()
        .zip(lines)
        .map(|(path, outcome)| {
            let refused = ["Operation not permitted", "Permission denied"]
                .into_iter()
                .find(|w| outcome.contains(w))
                .map(str::to_string);
            ProbeResult {
                path: path.clone(),
                refused,
                outcome: if outcome == "OK" {
                    "opened".into()
                } else {
                    outcome.rsplit(": ").next().unwrap_or(&outcome).to_string()
                },
            }
        })
        .collect())
}

/// The report as `gpu-check` prints it.
pub fn render(r: &Report) -> String {
    let mut out = String::from("Lock-down: can a process outside gpuslice exec open the GPUs?\n");
    for f in &r.files {
        out.push_str(&format!(
            "  {:<40} {:04o} {}:{}{}\n",
            f.path.display(),
            f.mode,
            f.uid,
            f.gid,
            if f.open_to_all {
                "  (every account may open it)"
            } else {
                ""
            }
        ));
    }
    if !r.probe.is_empty() {
        out.push_str(&format!("  probe: {}\n", r.probe_where));
        for p in &r.probe {
            out.push_str(&format!(
                "    {:<38} {}\n",
                p.path.display(),
                match &p.refused {
                    Some(_) => format!("refused ({})", p.outcome),
                    None => format!("reached the driver ({})", p.outcome),
                }
            ));
        }
    }
    out.push_str(&format!("verdict: {}\n", r.verdict()));
    out
}
