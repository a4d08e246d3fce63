//! Device isolation: a booking's processes may open only its own device
//! nodes. NVIDIA's character devices are `/dev/nvidiactl` and
//! `/dev/nvidiaN` (major 195), `/dev/nvidia-uvm` and `-tools` (a dynamic
//! major named `nvidia-uvm` in `/proc/devices`) and, for MIG, the
//! capability nodes `/dev/nvidia-caps/nvidia-capM` (major `nvidia-caps`,
//! minors listed in `/proc/driver/nvidia-caps/mig-minors`). Everything of
//! those majors that is not the booking's own is denied:
//! - cgroup v1: deny entries in the booking group's `devices.deny` (the
//!   group keeps the default "allow" so ordinary devices stay usable);
//! - cgroup v2: a `BPF_PROG_TYPE_CGROUP_DEVICE` program attached to the
//!   booking's group, assembled here at run time as runc does.
//!
//! A denied open fails with EPERM before any driver is asked.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// NVIDIA's major for `/dev/nvidiactl` and `/dev/nvidiaN` (fixed by the
/// driver, Linux's devices.txt lists it).
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const CTL_MINOR: u32 = 255;

/// One device file a booking's processes may open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceNode {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// As stored with a booking (`bookings.device_nodes`); `None` for none.
pub fn to_json(nodes: &[DeviceNode]) -> Option<serde_json::Value> {
    (!nodes.is_empty())
        .then(|| serde_json::to_value(nodes).ok())
        .flatten()
}

/// A booking's stored device files.
pub fn from_json(v: Option<&serde_json::Value>) -> Vec<DeviceNode> {
    v.and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// The NVIDIA device numbering of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDevices {
    /// Where the device files are (`/dev`, or the simulated node's).
    pub dev_dir: PathBuf,
    /// `/dev/nvidiactl` and `/dev/nvidiaN` (195 on a real node).
    pub frontend_major: u32,
    pub uvm_major: Option<u32>,
    pub caps_major: Option<u32>,
    /// Other NVIDIA majors (NVLink, IMEX channels): denied whole.
    pub other_majors: Vec<u32>,
    /// `gpuN/giG/access`, `gpuN/giG/ciC/access`, `config`, `monitor` → minor.
    pub mig_minors: BTreeMap<String, u32>,
}

/// Char-device majors by name, from `/proc/devices`.
pub fn parse_proc_devices(text: &str) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    let mut chars = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Character devices") {
            chars = true;
            continue;
        }
        if line.starts_with("Block devices") {
            chars = false;
            continue;
        }
        if !chars {
            continue;
        }
        if let Some((num, name)) = line.split_once(char::is_whitespace) {
            if let Ok(n) = num.trim().parse() {
                out.insert(name.trim().to_string(), n);
            }
        }
    }
    out
}

/// `name minor` lines of a `mig-minors` file.
pub fn parse_mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|l| {
            let (name, minor) = l.trim().rsplit_once(char::is_whitespace)?;
            Some((name.trim().to_string(), minor.trim().parse().ok()?))
        })
        .collect()
}

impl NodeDevices {
    /// The real node: `/proc/devices`, NVIDIA's `mig-minors`, `/dev`.
    /// `None` when no NVIDIA driver is loaded.
    pub fn detect() -> Option<NodeDevices> {
        let majors = parse_proc_devices(&std::fs::read_to_string("/proc/devices").ok()?);
        let frontend = *majors
            .get("nvidia-frontend")
            .or_else(|| majors.get("nvidia"))?;
        let mig_minors = std::fs::read_to_string("/proc/driver/nvidia-caps/mig-minors")
            .map(|t| parse_mig_minors(&t))
            .unwrap_or_default();
        Some(NodeDevices::from_majors(
            PathBuf::from("/dev"),
            frontend,
            &majors,
            mig_minors,
        ))
    }

    fn from_majors(
        dev_dir: PathBuf,
        frontend: u32,
        majors: &HashMap<String, u32>,
        mig_minors: BTreeMap<String, u32>,
    ) -> NodeDevices {
        let mut other: Vec<u32> = majors
            .iter()
            .filter(|(name, _)| {
                name.starts_with("nvidia")
                    && !matches!(
                        name.as_str(),
                        "nvidia" | "nvidia-frontend" | "nvidia-uvm" | "nvidia-caps"
                    )
            })
            .map(|(_, m)| *m)
            .filter(|m| *m != frontend)
            .collect();
        other.sort_unstable();
        other.dedup();
        NodeDevices {
            dev_dir,
            frontend_major: frontend,
            uvm_major: majors.get("nvidia-uvm").copied(),
            caps_major: majors.get("nvidia-caps").copied(),
            other_majors: other,
            mig_minors,
        }
    }

    /// The nodes a booking on GPU minor `gpu_minor` may open: the control
    /// and UVM nodes, its GPU, and for a MIG device (`mig`: GPU-instance
    /// and compute-instance ids) its two capability nodes. `None` when a
    /// MIG device's capabilities are not listed (the booking could not run).
    pub fn for_device(&self, gpu_minor: u32, mig: Option<(u32, u32)>) -> Option<Vec<DeviceNode>> {
        let node = |name: &str, major: u32, minor: u32| DeviceNode {
            path: self.dev_dir.join(name).display().to_string(),
            major,
            minor,
        };
        let mut out = vec![node("nvidiactl", self.frontend_major, CTL_MINOR)];
        if let Some(uvm) = self.uvm_major {
            out.push(node("nvidia-uvm", uvm, 0));
            out.push(node("nvidia-uvm-tools", uvm, 1));
        }
        out.push(node(
            &format!("nvidia{gpu_minor}"),
            self.frontend_major,
            gpu_minor,
        ));
        if let Some((gi, ci)) = mig {
            let caps = self.caps_major?;
            for name in [
                format!("gpu{gpu_minor}/gi{gi}/access"),
                format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access"),
            ] {
                let minor = *self.mig_minors.get(&name)?;
                out.push(node(&format!("nvidia-caps/nvidia-cap{minor}"), caps, minor));
            }
        }
        Some(out)
    }

    /// What a booking allowed `allowed` is confined to.
    pub fn policy(&self, allowed: &[DeviceNode]) -> DevicePolicy {
        let mut guarded = vec![Guarded {
            major: self.frontend_major,
            minors: Some((0..=255).collect()),
        }];
        if let Some(caps) = self.caps_major {
            guarded.push(Guarded {
                major: caps,
                minors: Some(self.mig_minors.values().copied().collect()),
            });
        }
        guarded.extend(self.other_majors.iter().map(|&major| Guarded {
            major,
            minors: None,
        }));
        DevicePolicy {
            guarded,
            allowed: allowed.iter().map(|d| (d.major, d.minor)).collect(),
        }
    }
}

/// A major whose devices are denied unless allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guarded {
    pub major: u32,
    /// Every minor the driver hands out (the v1 controller denies them one
    /// by one); `None`: the whole major, none allowed.
    pub minors: Option<Vec<u32>>,
}

/// One booking's device rule: the guarded majors and what it may open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePolicy {
    pub guarded: Vec<Guarded>,
    pub allowed: Vec<(u32, u32)>,
}

impl DevicePolicy {
    /// Whether a character device may be opened: what the v2 program
    /// enforces exactly. The v1 deny list enforces it for every minor the
    /// driver hands out (major 195's 256, the capability minors of
    /// `mig-minors`) and denies a guarded major with nothing allowed whole.
    pub fn permits(&self, major: u32, minor: u32) -> bool {
        !self.guarded.iter().any(|g| g.major == major) || self.allowed.contains(&(major, minor))
    }

    /// Lines for a v1 `devices.deny` (one write each), for a group whose
    /// default is to allow.
    pub fn v1_deny(&self) -> Vec<String> {
        let mut out = Vec::new();
        for g in &self.guarded {
            let any_allowed = self.allowed.iter().any(|(m, _)| *m == g.major);
            match &g.minors {
                // Nothing of it is the booking's: the whole major, including
                // minors the driver may hand out later.
                _ if !any_allowed => out.push(format!("c {}:* rwm", g.major)),
                Some(minors) => out.extend(
                    minors
                        .iter()
                        .filter(|m| !self.allowed.contains(&(g.major, **m)))
                        .map(|m| format!("c {}:{m} rwm", g.major)),
                ),
                None => out.push(format!("c {}:* rwm", g.major)),
            }
        }
        out
    }

    /// The eBPF program (`BPF_PROG_TYPE_CGROUP_DEVICE`): allow, unless a
    /// character device of a guarded major is not in the allowed list.
    pub fn bpf_program(&self) -> Vec<bpf::Insn> {
        use bpf::*;
        let allow_len = |n: usize| n as i16;
        // R2 = device type, R4 = major, R5 = minor.
        let mut checks = vec![
            ldx_w(2, 1, 0),
            and64_imm(2, 0xffff),
            ldx_w(4, 1, 4),
            ldx_w(5, 1, 8),
        ];
        let mut majors: Vec<u32> = self.guarded.iter().map(|g| g.major).collect();
        majors.sort_unstable();
        majors.dedup();
        // The body after the header: [type check] [major checks] [ja allow]
        // [allowed pairs] [deny] [allow].
        let pairs = &self.allowed;
        let guarded_pairs: Vec<(u32, u32)> = pairs
            .iter()
            .copied()
            .filter(|(m, _)| majors.contains(m))
            .collect();
        // Instruction counts of each part, to compute forward jumps.
        let n_majors = majors.len();
        let n_pairs = guarded_pairs.len() * 2;
        // Distance (in instructions after the jump) to the `allow` block
        // from instruction i of the body, where the deny block is 2 long.
        let body_len = 1 + n_majors + 1 + n_pairs + 2;
        let to_allow = |i: usize| allow_len(body_len - i - 1);
        let mut body = Vec::new();
        // Not a character device: allow.
        body.push(jne_imm(2, 2, to_allow(0)));
        for (k, major) in majors.iter().enumerate() {
            // A guarded major: go to the pair checks (after the `ja`).
            let i = 1 + k;
            let to_pairs = (n_majors - k - 1 + 1) as i16;
            debug_assert_eq!(body.len(), i);
            body.push(jeq_imm(4, *major as i32, to_pairs));
        }
        let i = 1 + n_majors;
        body.push(ja(to_allow(i)));
        for (k, (major, minor)) in guarded_pairs.iter().enumerate() {
            let i = 1 + n_majors + 1 + 2 * k;
            // Major differs: next pair; minor equal: allow.
            body.push(jne_imm(4, *major as i32, 1));
            body.push(jeq_imm(5, *minor as i32, to_allow(i + 1)));
        }
        body.push(mov64_imm(0, 0));
        body.push(exit());
        debug_assert_eq!(body.len(), body_len);
        checks.extend(body);
        checks.push(mov64_imm(0, 1));
        checks.push(exit());
        checks
    }
}

/// The few eBPF instructions the device program needs, encoded as the
/// kernel's `struct bpf_insn` (opcode, dst/src registers, offset, imm).
pub mod bpf {
    /// One instruction.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(C)]
    pub struct Insn {
        pub code: u8,
        /// dst in the low nibble, src in the high one.
        pub regs: u8,
        pub off: i16,
        pub imm: i32,
    }

    const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (src << 4) | (dst & 0x0f),
            off,
            imm,
        }
    }
    /// `dst = *(u32 *)(src + off)` (BPF_LDX | BPF_MEM | BPF_W).
    pub const fn ldx_w(dst: u8, src: u8, off: i16) -> Insn {
        insn(0x61, dst, src, off, 0)
    }
    /// `dst &= imm` (BPF_ALU64 | BPF_AND | BPF_K).
    pub const fn and64_imm(dst: u8, imm: i32) -> Insn {
        insn(0x57, dst, 0, 0, imm)
    }
    /// `dst = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
    pub const fn mov64_imm(dst: u8, imm: i32) -> Insn {
        insn(0xb7, dst, 0, 0, imm)
    }
    /// `if dst == imm goto +off` (BPF_JMP | BPF_JEQ | BPF_K).
    pub const fn jeq_imm(dst: u8, imm: i32, off: i16) -> Insn {
        insn(0x15, dst, 0, off, imm)
    }
    /// `if dst != imm goto +off` (BPF_JMP | BPF_JNE | BPF_K).
    pub const fn jne_imm(dst: u8, imm: i32, off: i16) -> Insn {
        insn(0x55, dst, 0, off, imm)
    }
    /// `goto +off` (BPF_JMP | BPF_JA).
    pub const fn ja(off: i16) -> Insn {
        insn(0x05, 0, 0, off, 0)
    }
    /// `return r0` (BPF_JMP | BPF_EXIT).
    pub const fn exit() -> Insn {
        insn(0x95, 0, 0, 0, 0)
    }

    /// Runs a program on a device context, as the kernel would (tests
    /// check the encoding against [`super::DevicePolicy::permits`]).
    pub fn interpret(prog: &[Insn], ctx: [u32; 3]) -> Option<u64> {
        let mut r = [0u64; 11];
        let mut pc = 0usize;
        for _ in 0..100_000 {
            let i = prog.get(pc)?;
            let (dst, src) = ((i.regs & 0x0f) as usize, (i.regs >> 4) as usize);
            let imm = i.imm as i64 as u64;
            let jump = |cond: bool, pc: usize| {
                if cond {
                    (pc as i64 + 1 + i.off as i64) as usize
                } else {
                    pc + 1
                }
            };
            pc = match i.code {
                0x61 if src == 1 => {
                    r[dst] = u64::from(*ctx.get(i.off as usize / 4)?);
                    pc + 1
                }
                0x57 => {
                    r[dst] &= imm;
                    pc + 1
                }
                0xb7 => {
                    r[dst] = imm;
                    pc + 1
                }
                0x15 => jump(r[dst] == imm, pc),
                0x55 => jump(r[dst] != imm, pc),
                0x05 => jump(true, pc),
                0x95 => return Some(r[0]),
                _ => return None,
            };
        }
        None
    }
}

/// The mechanism that confined a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    V1Devices,
    V2Bpf,
}

impl Mechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::V1Devices => "cgroup v1 devices",
            Mechanism::V2Bpf => "cgroup v2 BPF device program",
        }
    }
}

/// Writes the policy into a v1 `devices` group directory.
pub fn apply_v1(group_dir: &Path, policy: &DevicePolicy) -> std::io::Result<()> {
    use std::io::Write;
    // The denials first, then the booking's own files taken off the deny
    // list (a booking confined again after its instance was recreated with
    // other capability minors): under the group's default "allow", an
    // allow entry removes exactly that exception. Resetting with "a" first
    // would leave the group open in between (and fails on a group with
    // children). The kernel reads one rule per write.
    let mut deny = std::fs::OpenOptions::new()
        .write(true)
        .open(group_dir.join("devices.deny"))?;
    for line in policy.v1_deny() {
        deny.write_all(line.as_bytes())?;
    }
    let mut allow = std::fs::OpenOptions::new()
        .write(true)
        .open(group_dir.join("devices.allow"))?;
    for (major, minor) in &policy.allowed {
        if policy.guarded.iter().any(|g| g.major == *major) {
            allow.write_all(format!("c {major}:{minor} rwm").as_bytes())?;
        }
    }
    Ok(())
}

// The kernel's `union bpf_attr` parts used here, and its constants.
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// BPF_PROG_ATTACH and BPF_PROG_DETACH.
#[repr(C)]
#[derive(Clone, Copy)]
struct Attach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

/// BPF_PROG_GET_FD_BY_ID.
#[repr(C)]
struct GetById {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
}

/// BPF_PROG_QUERY.
#[repr(C)]
#[derive(Default)]
struct Query {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
}

/// One `bpf(2)` call with `attr`; the kernel's answer or errno.
fn bpf_call<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid `bpf_attr` prefix for `cmd`, alive for the
    // call; the kernel reads `size_of::<T>()` bytes of it and writes only
    // through the pointers it holds, which point at live buffers.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn annotate(e: std::io::Error, what: &str) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Ids of the device programs attached to a group directly.
fn attached_programs(dir: &std::fs::File) -> std::io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let mut ids = [0u32; 64];
    let mut q = Query {
        target_fd: dir.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: ids.len() as u32,
        ..Query::default()
    };
    bpf_call(BPF_PROG_QUERY, &mut q)
        .map_err(|e| annotate(e, "listing the group's device programs"))?;
    let n = q.prog_cnt as usize;
    Ok(ids[..n.min(ids.len())].to_vec())
}

/// Loads the policy's program and attaches it to a v2 group directory
/// (`BPF_F_ALLOW_MULTI`, so a parent's programs keep running too). The
/// attachment lives as long as the group.
pub fn apply_v2(group_dir: &Path, policy: &DevicePolicy) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let prog = policy.bpf_program();
    let license = c"Apache-2.0";
    #[repr(C)]
    #[derive(Default)]
    struct Load {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }
    // Kernels before 5.11 charge program memory to RLIMIT_MEMLOCK (runc
    // raises it too); later ones ignore it.
    let _ = nix::sys::resource::setrlimit(
        nix::sys::resource::Resource::RLIMIT_MEMLOCK,
        nix::sys::resource::RLIM_INFINITY,
        nix::sys::resource::RLIM_INFINITY,
    );
    let mut log = vec![0u8; 64 * 1024];
    let mut name = [0u8; 16];
    name[..12].copy_from_slice(b"gpuslice_dev");
    let mut load = Load {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: prog.len() as u32,
        insns: prog.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        ..Load::default()
    };
    // Without a log first: a log that fills its buffer fails the load
    // (ENOSPC) even for a valid program; the log is asked for only to
    // explain a refusal.
    let loaded = bpf_call(BPF_PROG_LOAD, &mut load).or_else(|_| {
        load.log_level = 1;
        load.log_size = log.len() as u32;
        load.log_buf = log.as_mut_ptr() as u64;
        bpf_call(BPF_PROG_LOAD, &mut load)
    });
    let fd = match loaded {
        Ok(fd) => fd,
        Err(e) => {
            let log = String::from_utf8_lossy(&log);
            let log = log.trim_end_matches('\0').trim();
            return Err(std::io::Error::new(
                e.kind(),
                format!("loading the device program: {e}{}", {
                    if log.is_empty() {
                        String::new()
                    } else {
                        format!(" ({log})")
                    }
                }),
            ));
        }
    };
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    let prog_fd = unsafe { <OwnedFd as FromRawFd>::from_raw_fd(fd as i32) };
    let dir = std::fs::File::open(group_dir)?;
    // Programs already on the group (confined before, its instance since
    // recreated): detached once the new one is on, so there is no moment
    // without one.
    let old = attached_programs(&dir)?;
    let mut attach = Attach {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: prog_fd.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        replace_bpf_fd: 0,
    };
    bpf_call(BPF_PROG_ATTACH, &mut attach)
        .map_err(|e| annotate(e, "attaching the device program"))?;
    for id in old {
        let mut get = GetById {
            prog_id: id,
            next_id: 0,
            open_flags: 0,
        };
        let Ok(fd) = bpf_call(BPF_PROG_GET_FD_BY_ID, &mut get) else {
            continue;
        };
        // SAFETY: a descriptor the kernel just opened for us.
        let old_fd = unsafe { <OwnedFd as FromRawFd>::from_raw_fd(fd as i32) };
        let mut detach = Attach {
            attach_bpf_fd: old_fd.as_raw_fd() as u32,
            attach_flags: 0,
            ..attach
        };
        bpf_call(BPF_PROG_DETACH, &mut detach)
            .map_err(|e| annotate(e, "detaching the previous device program"))?;
    }
    Ok(())
}

/// Simulated nodes: device files under `<dir>/<node>/` with NVIDIA's
/// numbering, on majors no loaded driver owns, so opening an allowed one
/// fails with ENXIO (no driver) and a denied one with EPERM (the cgroup).
pub mod sim {
    use super::*;

    /// GPU instances per GPU and compute instances per GPU instance the
    /// simulated `mig-minors` lists (NVIDIA's driver lists up to 15 GI ids
    /// and 8 CI ids per GPU).
    const GI_IDS: u32 = 15;
    const CI_IDS: u32 = 8;
    /// GPUs the simulated `mig-minors` lists.
    const GPUS: u32 = 8;

    /// Majors for the simulated frontend, UVM and capability devices: 195
    /// when no driver holds it, else and for the others the first free of
    /// Linux's "local/experimental use" ranges 120–127 and 60–63
    /// (devices.txt), which the kernel never hands out dynamically (its
    /// dynamic majors come from 234–254 and 384–511), so no driver loaded
    /// later takes them over.
    fn pick_majors() -> Option<(u32, u32, u32)> {
        let used: Vec<u32> =
            parse_proc_devices(&std::fs::read_to_string("/proc/devices").unwrap_or_default())
                .into_values()
                .collect();
        let mut free = (120..=127).chain(60..=63).filter(|m| !used.contains(m));
        let frontend = if used.contains(&NVIDIA_MAJOR) {
            free.next()?
        } else {
            NVIDIA_MAJOR
        };
        Some((frontend, free.next()?, free.next()?))
    }

    /// `mig-minors` as the simulated driver numbers them.
    pub fn mig_minors() -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        out.insert("config".to_string(), 1);
        out.insert("monitor".to_string(), 2);
        let mut next = 3;
        for g in 0..GPUS {
            for gi in 0..GI_IDS {
                out.insert(format!("gpu{g}/gi{gi}/access"), next);
                next += 1;
                for ci in 0..CI_IDS {
                    out.insert(format!("gpu{g}/gi{gi}/ci{ci}/access"), next);
                    next += 1;
                }
            }
        }
        out
    }

    /// The device numbering of simulated node `node` with `gpus` GPUs,
    /// its files made under `dir/<node>/` where the process may (root on
    /// a file system that allows device files); the numbering stands
    /// either way.
    pub fn prepare(dir: &Path, node: &str, gpus: u32) -> Option<NodeDevices> {
        let (frontend, uvm, caps) = pick_majors()?;
        let dev_dir = dir.join(node);
        let mut majors = HashMap::new();
        majors.insert("nvidia-uvm".to_string(), uvm);
        majors.insert("nvidia-caps".to_string(), caps);
        let minors = mig_minors();
        let nd = NodeDevices::from_majors(dev_dir.clone(), frontend, &majors, minors.clone());
        let mut files: Vec<DeviceNode> = Vec::new();
        for g in 0..gpus.min(GPUS) {
            files.extend(nd.for_device(g, None).unwrap_or_default());
        }
        for (name, minor) in &minors {
            if name.starts_with("gpu")
                && name
                    .split('/')
                    .next()
                    .and_then(|g| g[3..].parse::<u32>().ok())
                    .is_some_and(|g| g < gpus)
            {
                files.push(DeviceNode {
                    path: dev_dir
                        .join(format!("nvidia-caps/nvidia-cap{minor}"))
                        .display()
                        .to_string(),
                    major: caps,
                    minor: *minor,
                });
            }
        }
        let _ = std::fs::create_dir_all(dev_dir.join("nvidia-caps"));
        let text: String = minors.iter().map(|(n, m)| format!("{n} {m}\n")).collect();
        let _ = std::fs::write(dev_dir.join("mig-minors"), text);
        for f in files {
            make_node(Path::new(&f.path), f.major, f.minor);
        }
        Some(nd)
    }

    fn make_node(path: &Path, major: u32, minor: u32) {
        use nix::sys::stat::{makedev, mknod, stat, Mode, SFlag};
        if let Ok(s) = stat(path) {
            if s.st_rdev == makedev(major.into(), minor.into()) {
                return;
            }
            let _ = std::fs::remove_file(path);
        }
        // Not root, or a `nodev` file system: the numbering still holds,
        // the files are just not there to open.
        if mknod(
            path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major.into(), minor.into()),
        )
        .is_ok()
        {
            // NVIDIA's default mode (the umask took some of it).
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nd() -> NodeDevices {
        let mut majors = HashMap::new();
        majors.insert("nvidia-uvm".into(), 510);
        majors.insert("nvidia-caps".into(), 509);
        majors.insert("nvidia-nvlink".into(), 508);
        NodeDevices::from_majors("/dev".into(), 195, &majors, sim::mig_minors())
    }

    #[test]
    fn proc_devices_and_mig_minors_parse() {
        let d = parse_proc_devices(
            "Character devices:\n  1 mem\n195 nvidia-frontend\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n",
        );
        assert_eq!(d.get("nvidia-frontend"), Some(&195));
        assert_eq!(d.get("nvidia-uvm"), Some(&510));
        assert_eq!(d.get("loop"), None);
        let m =
            parse_mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n");
        assert_eq!(m.get("gpu0/gi1/ci0/access"), Some(&13));
    }

    #[test]
    fn a_mig_booking_gets_its_gpu_and_its_two_capabilities() {
        let n = nd();
        let nodes = n.for_device(1, Some((2, 0))).unwrap();
        let paths: Vec<&str> = nodes.iter().map(|d| d.path.as_str()).collect();
        let gi = n.mig_minors["gpu1/gi2/access"];
        let ci = n.mig_minors["gpu1/gi2/ci0/access"];
        assert_eq!(
            paths,
            vec![
                "/dev/nvidiactl".to_string(),
                "/dev/nvidia-uvm".into(),
                "/dev/nvidia-uvm-tools".into(),
                "/dev/nvidia1".into(),
                format!("/dev/nvidia-caps/nvidia-cap{gi}"),
                format!("/dev/nvidia-caps/nvidia-cap{ci}"),
            ]
        );
        let p = n.policy(&nodes);
        assert!(p.permits(195, 1) && p.permits(195, 255) && p.permits(510, 1));
        assert!(!p.permits(195, 0) && !p.permits(509, gi + 9) && !p.permits(508, 0));
        assert!(p.permits(1, 3), "ordinary devices stay open");
        let deny = p.v1_deny();
        assert!(deny.contains(&"c 195:0 rwm".to_string()));
        assert!(!deny.contains(&"c 195:1 rwm".to_string()));
        assert!(deny.contains(&"c 508:* rwm".to_string()));
        assert!(!deny.iter().any(|l| l.starts_with("c 510:")));
    }

    proptest! {
        /// The assembled program decides every device as the policy does.
        #[test]
        fn the_bpf_program_agrees_with_the_policy(
            gpu in 0u32..8, gi in 0u32..15, ci in 0u32..8, mig in any::<bool>(),
            probes in proptest::collection::vec((1u32..3, prop_oneof![Just(195u32), Just(509), Just(510), Just(508), 0u32..600], 0u32..1200), 1..200)
        ) {
            let n = nd();
            let nodes = n.for_device(gpu, mig.then_some((gi, ci))).unwrap();
            let p = n.policy(&nodes);
            let prog = p.bpf_program();
            for (ty, major, minor) in probes {
                let want = ty != 2 || p.permits(major, minor);
                let got = bpf::interpret(&prog, [ty | (3 << 16), major, minor]);
                prop_assert_eq!(got, Some(u64::from(want)), "type {} {}:{}", ty, major, minor);
            }
            for d in &nodes {
                prop_assert_eq!(bpf::interpret(&prog, [2, d.major, d.minor]), Some(1));
            }
        }
    }
}
