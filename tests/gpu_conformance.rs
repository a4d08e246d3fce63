//! The GPU backend conformance suite. Every rule is written once against the
//! `GpuBackend` trait and runs against `sim` and against `nvml` on the
//! project's stand-in `libnvidia-ml.so` (built here by the test). Answers are
//! compared by their NVML return codes, which both backends give.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gpuslice::gpu::catalog::{self, Placement};
use gpuslice::gpu::fleet::Fleet;
use gpuslice::gpu::mig::MigError;
use gpuslice::gpu::nvml::NvmlBackend;
use gpuslice::gpu::sim::SimBackend;
use gpuslice::gpu::sim::Staged;
use gpuslice::gpu::{BackendError, EventKind, GpuBackend, GpuEvent, GpuInfo};

const FLEET: &str = r#"
[[node]]
name = "n1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 2
[[node.gpu]]
model = "A30-24GB"
mode = "mig"
[[node.gpu]]
model = "L40S-48GB"
mode = "timeslice"
"#;

const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;
const INSUFFICIENT_RESOURCES: u32 = 23;

fn sim(dir: Option<&std::path::Path>) -> SimBackend {
    SimBackend::open(&Fleet::parse(FLEET).unwrap(), "n1", dir).unwrap()
}

/// The stand-in, pointed at FLEET (set once, before any copy is loaded).
fn standin_copy() -> PathBuf {
    static ENV: OnceLock<()> = OnceLock::new();
    ENV.get_or_init(|| {
        let fleet = std::env::temp_dir().join(format!(
            "gpuslice-conformance-fleet-{}.toml",
            std::process::id()
        ));
        std::fs::write(&fleet, FLEET).unwrap();
        std::env::set_var("GPUSLICE_FLEET", &fleet);
        std::env::set_var("GPUSLICE_NVML_NODE", "n1");
    });
    common::standin_copy()
}

fn nvml() -> (NvmlBackend, PathBuf) {
    let lib = standin_copy();
    (NvmlBackend::open(Some(&lib), None, false).unwrap(), lib)
}

fn gpu(b: &dyn GpuBackend, model: &str) -> GpuInfo {
    b.inventory()
        .unwrap()
        .into_iter()
        .find(|g| g.model.as_deref() == Some(model))
        .unwrap()
}

fn pid(model: &str, profile: &str) -> u32 {
    catalog::model(model)
        .unwrap()
        .profile(profile)
        .unwrap()
        .nvml_id
}

fn pl(start: u8, size: u8) -> Placement {
    Placement { start, size }
}

fn code(e: BackendError) -> u32 {
    e.nvml_code()
        .unwrap_or_else(|| panic!("no NVML code for {e}"))
}

fn is_uuid_form(s: &str, prefix: &str) -> bool {
    let Some(rest) = s.strip_prefix(prefix) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

// ------------------------------------------------------------ the rules

fn inventory_reports_models_uuids_and_modes(b: &dyn GpuBackend) {
    let inv = b.inventory().unwrap();
    assert_eq!(inv.len(), 4);
    assert!(inv.iter().all(|g| is_uuid_form(&g.uuid, "GPU-")), "{inv:?}");
    let h100 = gpu(b, "H100-80GB");
    assert!(h100.mig_current && !h100.mode_change_pending());
    assert_eq!(h100.memory_mib, 80 * 1024);
    assert_eq!(
        inv.iter().map(|g| g.index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(!gpu(b, "L40S-48GB").mig_current);
}

fn only_allowed_placements(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let three_g = pid("H100-80GB", "3g.40gb");
    assert_eq!(
        code(b.create_instance(&g, three_g, pl(2, 4)).unwrap_err()),
        INVALID_ARGUMENT
    );
    assert_eq!(
        code(b.create_instance(&g, three_g, pl(0, 2)).unwrap_err()),
        INVALID_ARGUMENT,
        "wrong size"
    );
    assert_eq!(
        code(b.create_instance(&g, 99, pl(0, 1)).unwrap_err()),
        NOT_SUPPORTED,
        "unknown profile"
    );
    assert!(
        b.instances(&g).unwrap().is_empty(),
        "a refusal changes nothing"
    );
}

fn overlap_is_insufficient_resources(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let i = b
        .create_instance(&g, pid("H100-80GB", "1g.10gb"), pl(2, 1))
        .unwrap();
    let four_g = pid("H100-80GB", "4g.40gb");
    assert_eq!(
        code(b.create_instance(&g, four_g, pl(0, 4)).unwrap_err()),
        INSUFFICIENT_RESOURCES
    );
    b.destroy_instance(&g, i.gi_id, Duration::ZERO).unwrap();
    b.create_instance(&g, four_g, pl(0, 4)).unwrap();
    assert_eq!(
        code(
            b.create_instance(&g, pid("H100-80GB", "7g.80gb"), pl(0, 8))
                .unwrap_err()
        ),
        INSUFFICIENT_RESOURCES
    );
}

fn max_counts_and_media_engines(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let me = pid("H100-80GB", "1g.10gb+me");
    b.create_instance(&g, me, pl(0, 1)).unwrap();
    assert_eq!(
        code(b.create_instance(&g, me, pl(1, 1)).unwrap_err()),
        INSUFFICIENT_RESOURCES
    );
    let one_g = pid("H100-80GB", "1g.10gb");
    for s in 1..7 {
        b.create_instance(&g, one_g, pl(s, 1)).unwrap();
    }
    assert_eq!(b.instances(&g).unwrap().len(), 7);
    let a30 = gpu(b, "A30-24GB").uuid;
    b.create_instance(&a30, pid("A30-24GB", "2g.12gb+me"), pl(0, 2))
        .unwrap();
    assert_eq!(
        code(
            b.create_instance(&a30, pid("A30-24GB", "1g.6gb+me"), pl(2, 1))
                .unwrap_err()
        ),
        INSUFFICIENT_RESOURCES
    );
}

fn created_instances_have_mig_uuids_and_placements(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let i = b
        .create_instance(&g, pid("H100-80GB", "3g.40gb"), pl(4, 4))
        .unwrap();
    assert_eq!(i.profile, "3g.40gb");
    assert_eq!(i.placement, pl(4, 4));
    assert!(i.ci_id.is_some());
    let dev = i.device_uuid.clone().unwrap();
    assert!(is_uuid_form(&dev, "MIG-"), "{dev}");
    let j = b
        .create_instance(&g, pid("H100-80GB", "2g.20gb"), pl(0, 2))
        .unwrap();
    assert_eq!(b.instances(&g).unwrap(), vec![j, i], "listed by placement");
    assert!(b.processes(&dev).unwrap().is_empty());
}

fn errors_for_what_is_not_there(b: &dyn GpuBackend) {
    let l40s = gpu(b, "L40S-48GB").uuid;
    assert_eq!(
        code(b.create_instance(&l40s, 19, pl(0, 1)).unwrap_err()),
        NOT_SUPPORTED,
        "not in MIG mode"
    );
    assert_eq!(
        code(
            b.instances("GPU-00000000-0000-0000-0000-000000000000")
                .unwrap_err()
        ),
        NOT_FOUND
    );
    let h100 = gpu(b, "H100-80GB").uuid;
    assert_eq!(
        code(b.destroy_instance(&h100, 99, Duration::ZERO).unwrap_err()),
        NOT_FOUND
    );
    assert!(b
        .processes("MIG-00000000-0000-0000-0000-000000000000")
        .is_err());
}

fn telemetry_follows_the_hardware(b: &dyn GpuBackend) {
    let mig = b.telemetry(&gpu(b, "H100-80GB").uuid).unwrap();
    assert_eq!(
        mig.utilization_pct, None,
        "no whole-GPU utilisation in MIG mode"
    );
    assert_eq!(mig.memory_total_mib, 80 * 1024);
    assert!(mig.temperature_c.is_some() && mig.power_w.is_some());
    let shared = b.telemetry(&gpu(b, "L40S-48GB").uuid).unwrap();
    assert!(shared.utilization_pct.is_some());
}

/// Destroy ends the processes holding the instance, then destroys it.
fn destroy_ends_processes(b: &dyn GpuBackend, attach: &dyn Fn(&str, u32)) {
    let g = gpu(b, "H100-80GB").uuid;
    let i = b.create_instance(&g, 19, pl(0, 1)).unwrap();
    let dev = i.device_uuid.clone().unwrap();
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    attach(&dev, child.id());
    assert_eq!(
        b.processes(&dev)
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [child.id()]
    );
    let ended = b
        .destroy_instance(&g, i.gi_id, Duration::from_millis(200))
        .unwrap();
    assert_eq!(
        ended.iter().map(|p| p.pid).collect::<Vec<_>>(),
        [child.id()]
    );
    assert!(!child.wait().unwrap().success(), "the process was ended");
    assert!(b.instances(&g).unwrap().is_empty());
}

type Rule = fn(&dyn GpuBackend);
const RULES: [(&str, Rule); 7] = [
    ("inventory", inventory_reports_models_uuids_and_modes),
    ("placements", only_allowed_placements),
    ("overlap", overlap_is_insufficient_resources),
    ("max counts and +me", max_counts_and_media_engines),
    ("mig uuids", created_instances_have_mig_uuids_and_placements),
    ("missing things", errors_for_what_is_not_there),
    ("telemetry", telemetry_follows_the_hardware),
];

#[test]
fn sim_conforms() {
    for (name, rule) in RULES {
        eprintln!("sim: {name}");
        rule(&sim(None));
    }
    let b = Arc::new(sim(None));
    let b2 = b.clone();
    destroy_ends_processes(&*b, &move |dev, pid| {
        b2.attach_process(dev, pid, 512).unwrap()
    });
}

#[test]
fn nvml_on_the_standin_conforms() {
    for (name, rule) in RULES {
        eprintln!("nvml: {name}");
        let (b, _) = nvml();
        rule(&b);
    }
    let (b, lib) = nvml();
    let attach = move |dev: &str, pid: u32| {
        // SAFETY: the test hook's C prototype is (const char*, uint, ulonglong) -> uint.
        unsafe {
            let l = libloading::Library::new(&lib).unwrap();
            let f: libloading::Symbol<
                unsafe extern "C" fn(*const std::ffi::c_char, u32, u64) -> u32,
            > = l.get(b"gpusliceStandinAttachProcess").unwrap();
            let c = std::ffi::CString::new(dev).unwrap();
            assert_eq!(f(c.as_ptr(), pid, 512), 0);
        }
    };
    destroy_ends_processes(&b, &attach);
}

// ------------------------------------------- faults, device samples, events

/// How a test reaches past the backend into the "hardware": stage values
/// on GPU `index`, raise an XID, attach a process to a device.
struct World<'a> {
    stage: &'a dyn Fn(u32, &Staged),
    event: &'a dyn Fn(u32, EventKind, u64),
    attach: &'a dyn Fn(&str, u32, u64),
}

/// Staged faults, MIG device samples and XID events read the same through
/// both backends (what `gpuslice sim` stages is what NVML would report).
fn faults_and_events(b: &dyn GpuBackend, w: &World) {
    let h100 = gpu(b, "H100-80GB");
    (w.stage)(
        h100.index,
        &Staged {
            temperature_c: Some(92),
            utilization_pct: Some(97),
            ecc_uncorrectable: Some(2),
            ..Staged::default()
        },
    );
    let t = b.telemetry(&h100.uuid).unwrap();
    assert_eq!(
        (t.temperature_c, t.utilization_pct, t.ecc_uncorrectable),
        (Some(92), Some(97), Some(2))
    );
    // A MIG device with a process reports its memory.
    let i = b.create_instance(&h100.uuid, 19, pl(0, 1)).unwrap();
    let dev = i.device_uuid.clone().unwrap();
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    (w.attach)(&dev, child.id(), 9_000);
    let t = b.telemetry(&h100.uuid).unwrap();
    let d = t
        .devices
        .iter()
        .find(|d| d.device_uuid == dev)
        .expect("the MIG device is sampled");
    assert_eq!(d.memory_used_mib, 9_000);
    assert!(d.memory_total_mib >= 9 * 1024, "{d:?}");
    b.destroy_instance(&h100.uuid, i.gi_id, Duration::from_millis(200))
        .unwrap();
    let _ = child.wait();
    // Lost: telemetry says so.
    (w.stage)(
        h100.index,
        &Staged {
            lost: true,
            ..Staged::default()
        },
    );
    assert!(matches!(
        b.telemetry(&h100.uuid),
        Err(BackendError::GpuLost(_))
    ));
    (w.stage)(h100.index, &Staged::default());
    assert_eq!(b.telemetry(&h100.uuid).unwrap().temperature_c, Some(32));
    // Driver events arrive by waiting, not polling.
    assert!(b.wait_events(Duration::from_millis(50)).unwrap().is_empty());
    (w.event)(h100.index, EventKind::Xid, 79);
    (w.event)(h100.index, EventKind::EccUncorrectable, 1);
    let mut events = Vec::new();
    while events.len() < 2 {
        let got = b.wait_events(Duration::from_secs(2)).unwrap();
        assert!(!got.is_empty(), "events arrive: {events:?}");
        events.extend(got);
    }
    let ev = |kind, code| GpuEvent {
        gpu_uuid: h100.uuid.clone(),
        kind,
        code,
    };
    assert_eq!(
        events,
        [ev(EventKind::Xid, 79), ev(EventKind::EccUncorrectable, 1)]
    );
}

#[test]
fn sim_faults_and_events() {
    let b = Arc::new(sim(None));
    let (b1, b2, b3) = (b.clone(), b.clone(), b.clone());
    faults_and_events(
        &*b,
        &World {
            stage: &move |i, s| {
                let s = s.clone();
                b1.stage(i, move |x| *x = s).unwrap()
            },
            event: &move |i, kind, code| b2.raise_event(i, kind, code).unwrap(),
            attach: &move |dev, pid, mib| b3.attach_process(dev, pid, mib).unwrap(),
        },
    );
}

#[test]
fn nvml_faults_and_events_on_the_standin() {
    let (b, lib) = nvml();
    // SAFETY (all three): the hooks' C prototypes are as declared; device
    // handles come from NVML itself.
    let l = unsafe { libloading::Library::new(&lib).unwrap() };
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap();
    let handle =
        |i: u32| unsafe { nvml.device_by_index(i).unwrap().handle() } as *mut std::ffi::c_void;
    let stage = |i: u32, s: &Staged| unsafe {
        let f: libloading::Symbol<
            unsafe extern "C" fn(*mut std::ffi::c_void, *const std::ffi::c_char) -> u32,
        > = l.get(b"gpusliceStandinStage").unwrap();
        let json = std::ffi::CString::new(serde_json::to_string(s).unwrap()).unwrap();
        assert_eq!(f(handle(i), json.as_ptr()), 0);
    };
    let event = |i: u32, kind: EventKind, code: u64| unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_void, u64, u64) -> u32> =
            l.get(b"gpusliceStandinEvent").unwrap();
        // nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError
        let t = match kind {
            EventKind::Xid => 0x8,
            EventKind::EccUncorrectable => 0x2,
        };
        assert_eq!(f(handle(i), t, code), 0);
    };
    let attach = |dev: &str, pid: u32, mib: u64| unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn(*const std::ffi::c_char, u32, u64) -> u32> =
            l.get(b"gpusliceStandinAttachProcess").unwrap();
        let c = std::ffi::CString::new(dev).unwrap();
        assert_eq!(f(c.as_ptr(), pid, mib), 0);
    };
    faults_and_events(
        &b,
        &World {
            stage: &stage,
            event: &event,
            attach: &attach,
        },
    );
}

// ------------------------------------------------- NVML backend specifics

#[test]
fn nvml_backend_without_a_library_says_so() {
    let err = NvmlBackend::open(
        Some(std::path::Path::new("/nonexistent/libnvidia-ml.so.1")),
        None,
        false,
    )
    .err()
    .unwrap();
    assert!(
        err.contains("could not be loaded from /nonexistent/libnvidia-ml.so.1"),
        "{err}"
    );
    assert!(err.contains("GPUSLICE_BACKEND=sim"), "{err}");
}

#[test]
fn nvml_backend_manages_only_the_gpus_it_is_told_to() {
    let lib = standin_copy();
    let all = NvmlBackend::open(Some(&lib), None, false)
        .unwrap()
        .inventory()
        .unwrap();
    let lib = standin_copy();
    let b = NvmlBackend::open(
        Some(&lib),
        Some(vec!["0".into(), all[3].uuid.clone()]),
        false,
    )
    .unwrap();
    let inv = b.inventory().unwrap();
    assert_eq!(inv.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 3]);
    assert!(matches!(
        b.instances(&all[1].uuid).unwrap_err(),
        BackendError::NoSuchGpu(_)
    ));
    assert!(
        b.create_instance(&all[1].uuid, 19, pl(0, 1)).is_err(),
        "an unmanaged GPU is left alone"
    );
    let lib = standin_copy();
    let err = NvmlBackend::open(Some(&lib), Some(vec!["GPU-nope".into()]), false)
        .err()
        .unwrap();
    assert!(
        err.contains("\"GPU-nope\", which is no GPU on this node"),
        "{err}"
    );
}

#[test]
fn nvml_backend_changes_mig_mode_only_when_allowed_and_reports_pending() {
    let (b, _) = nvml();
    let g = gpu(&b, "H100-80GB").uuid;
    let e = b.switch_mig_mode(&g, false).unwrap_err();
    assert!(
        e.to_string().contains("GPUSLICE_NVML_ALLOW_MODE_CHANGE"),
        "{e}"
    );
    assert!(gpu(&b, "H100-80GB").mig_current);

    let lib = standin_copy();
    let b = NvmlBackend::open(Some(&lib), None, true).unwrap();
    let i = b.create_instance(&g, 19, pl(0, 1)).unwrap();
    assert_eq!(
        code(b.switch_mig_mode(&g, false).unwrap_err()),
        19,
        "IN_USE while instances exist"
    );
    b.destroy_instance(&g, i.gi_id, Duration::ZERO).unwrap();
    b.switch_mig_mode(&g, false).unwrap();
    let info = gpu(&b, "H100-80GB");
    assert!(
        info.mig_current && info.mode_change_pending(),
        "pending until the GPU is reset"
    );
}

// --------------------------------------------- sim-only: state and faults

#[test]
fn a_restart_finds_the_instances_it_left() {
    let dir = tempdir("restart");
    let g;
    let made;
    {
        let b = sim(Some(&dir));
        g = gpu(&b, "H100-80GB").uuid;
        made = b.create_instance(&g, 9, pl(4, 4)).unwrap();
    }
    let b = sim(Some(&dir));
    assert_eq!(b.instances(&g).unwrap(), vec![made]);
    // And the rules still see it.
    assert!(b.create_instance(&g, 5, pl(0, 4)).is_ok());
    assert!(b.create_instance(&g, 9, pl(4, 4)).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_processes_on_one_simulated_node_see_the_same_hardware() {
    // Two backends on one state file stand for two processes (a worker and
    // a second one waiting for the node's lock, or a tool): what one
    // creates, the other sees, and the other's reads never write back a
    // stale copy.
    let dir = std::env::temp_dir().join(format!("gpuslice-sim-shared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let a = sim(Some(&dir));
    let b = sim(Some(&dir));
    let g = gpu(&a, "H100-80GB").uuid;
    let made = a.create_instance(&g, 9, pl(4, 4)).unwrap();
    b.telemetry(&g).unwrap();
    b.inventory().unwrap();
    assert_eq!(a.instances(&g).unwrap(), vec![made.clone()]);
    assert_eq!(b.instances(&g).unwrap(), vec![made]);
    // The rules hold across them: b cannot take a's slots.
    assert!(b.create_instance(&g, 9, pl(4, 4)).is_err());
    b.create_instance(&g, 9, pl(0, 4)).unwrap();
    assert_eq!(a.instances(&g).unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sim_errors_name_the_rule() {
    let b = sim(None);
    let g = gpu(&b, "H100-80GB").uuid;
    let e = b.create_instance(&g, 9, pl(2, 4)).unwrap_err();
    assert!(
        matches!(e, BackendError::Mig(MigError::BadPlacement { .. })),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "3g.40gb cannot be placed at slice 2 (size 4); allowed starts: [0, 4]"
    );
    b.create_instance(&g, 19, pl(4, 1)).unwrap();
    let e = b.create_instance(&g, 9, pl(4, 4)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "3g.40gb at slices 4..8 overlaps an existing instance at 4..5"
    );
}

#[test]
fn mig_mode_changes_wait_for_a_reset() {
    let b = sim(None);
    let l40s = gpu(&b, "L40S-48GB").uuid;
    assert!(b.set_mig_mode(&l40s, true).is_err(), "L40S has no MIG");
    let g = gpu(&b, "H100-80GB").uuid;
    let i = b.create_instance(&g, 19, pl(0, 1)).unwrap();
    assert!(matches!(
        b.set_mig_mode(&g, false).unwrap_err(),
        BackendError::NotEmpty { .. }
    ));
    b.destroy_instance(&g, i.gi_id, Duration::ZERO).unwrap();
    b.set_mig_mode(&g, false).unwrap();
    let info = gpu(&b, "H100-80GB");
    assert!(
        info.mig_current && info.mode_change_pending(),
        "pending until reset"
    );
    b.create_instance(&g, 19, pl(0, 1)).unwrap();
    b.reset(&g).unwrap();
    let info = b
        .inventory()
        .unwrap()
        .into_iter()
        .find(|x| x.uuid == g)
        .unwrap();
    assert!(!info.mig_current && !info.mode_change_pending());
    assert!(matches!(
        b.create_instance(&g, 19, pl(0, 1)).unwrap_err(),
        BackendError::NotMig(_)
    ));
}

#[test]
fn injected_faults() {
    let b = sim(None);
    let g = gpu(&b, "H100-80GB").uuid;
    b.fail_next_create("simulated driver error");
    assert_eq!(
        b.create_instance(&g, 19, pl(0, 1)).unwrap_err(),
        BackendError::Driver("simulated driver error".into())
    );
    assert!(
        b.create_instance(&g, 19, pl(0, 1)).is_ok(),
        "only the next one fails"
    );
    b.set_lost(&g, true);
    assert_eq!(
        b.inventory().unwrap().len(),
        3,
        "a lost GPU disappears from the inventory"
    );
    assert!(matches!(
        b.instances(&g).unwrap_err(),
        BackendError::GpuLost(_)
    ));
    b.set_lost(&g, false);
    assert_eq!(b.instances(&g).unwrap().len(), 1);
    b.set_delay(Duration::from_millis(30));
    let t = std::time::Instant::now();
    b.inventory().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "slow calls are slow"
    );
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_device_check_reads_nvml_and_compares_with_the_catalog() {
    let lib = standin_copy();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["gpu-check", "--nvml-lib"])
        .arg(&lib)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("NVIDIA H100 80GB HBM3") && text.contains("H100-80GB"),
        "{text}"
    );
    assert!(
        text.contains("MIG 3g.40gb"),
        "the driver's own names: {text}"
    );
    assert!(text.contains("driver gpuslice-standin"), "{text}");
    assert!(text.contains("one full walk:"), "{text}");
    // Two H100s and an A30 with 7 + 7 + 5 profiles; the L40S has none.
    assert!(
        text.contains("19 of 19 profiles agree with the catalog"),
        "{text}"
    );
    // The JSON form, to diff a real GPU's answers against the catalog.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["gpu-check", "--json", "--nvml-lib"])
        .arg(&lib)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let profiles = r["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 19);
    assert!(profiles.iter().all(|p| p["agrees"] == true && p["rc"] == 0));
    assert_eq!(r["gpus"][0]["provenance"], "documented");
    // The driver's memory next to the catalog's nominal one (an H100 2g is
    // 19.62 GiB, not the A100's 19.5): reported, not a disagreement.
    let two_g = profiles
        .iter()
        .find(|p| p["gpu_index"] == 0 && p["catalog_name"] == "2g.20gb")
        .unwrap();
    assert_eq!(two_g["memory_mib"], 20090);
    assert_eq!(two_g["catalog_memory_mib"], 19968);
    assert!(r["walk_ms"].as_f64().unwrap() > 0.0);
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["gpu-check", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not be loaded"));
}

/// The stand-in answers raw NVML calls the way NVML does.
#[test]
fn the_standin_has_nvml_semantics() {
    use nvml_wrapper::Nvml;
    use nvml_wrapper_sys::bindings as sys;
    let lib = standin_copy();
    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    let raw = nvml.lib();
    let dev = unsafe { nvml.device_by_index(0).unwrap().handle() };
    // SAFETY: every pointer is a live local of the prototype's type.
    unsafe {
        // The enum index is not the profile id: enum 9 (1_SLICE_REV2) is id 15.
        let mut info: sys::nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(
            (raw.nvmlDeviceGetGpuInstanceProfileInfo.as_ref().unwrap())(dev, 9, &mut info),
            0
        );
        assert_eq!((info.id, info.sliceCount, info.instanceCount), (15, 1, 4));
        // _v2 placements: a null buffer asks for the count.
        let placements = raw
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref()
            .unwrap();
        let mut n = 0;
        assert_eq!(placements(dev, 15, std::ptr::null_mut(), &mut n), 0);
        assert_eq!(n, 4);
        let mut buf = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 4];
        assert_eq!(placements(dev, 15, buf.as_mut_ptr(), &mut n), 0);
        assert_eq!(
            buf.iter().map(|p| (p.start, p.size)).collect::<Vec<_>>(),
            [(0, 2), (2, 2), (4, 2), (6, 2)]
        );
        // No MIG device yet: NOT_FOUND at index 0.
        let mut mig: sys::nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            (raw.nvmlDeviceGetMigDeviceHandleByIndex.as_ref().unwrap())(dev, 0, &mut mig),
            NOT_FOUND
        );
        // Create a 3g at 4, then an overlapping 4g at 0 is refused...
        let create = raw
            .nvmlDeviceCreateGpuInstanceWithPlacement
            .as_ref()
            .unwrap();
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        assert_eq!(
            create(
                dev,
                9,
                &sys::nvmlGpuInstancePlacement_t { start: 4, size: 4 },
                &mut gi
            ),
            0
        );
        let mut other: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        assert_eq!(
            create(
                dev,
                5,
                &sys::nvmlGpuInstancePlacement_t { start: 2, size: 4 },
                &mut other
            ),
            INVALID_ARGUMENT
        );
        assert_eq!(
            create(
                dev,
                9,
                &sys::nvmlGpuInstancePlacement_t { start: 4, size: 4 },
                &mut other
            ),
            INSUFFICIENT_RESOURCES
        );
        // ...a compute instance makes the MIG device, and the GPU instance is IN_USE.
        let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
        assert_eq!(
            (raw.nvmlGpuInstanceCreateComputeInstance.as_ref().unwrap())(gi, 2, &mut ci),
            0
        );
        assert_eq!((raw.nvmlGpuInstanceDestroy.as_ref().unwrap())(gi), 19);
        assert_eq!(
            (raw.nvmlDeviceGetMigDeviceHandleByIndex.as_ref().unwrap())(dev, 0, &mut mig),
            0
        );
        let mut uuid = [0 as std::ffi::c_char; 96];
        assert_eq!(
            (raw.nvmlDeviceGetUUID.as_ref().unwrap())(mig, uuid.as_mut_ptr(), 96),
            0
        );
        let uuid = std::ffi::CStr::from_ptr(uuid.as_ptr())
            .to_string_lossy()
            .to_string();
        assert!(is_uuid_form(&uuid, "MIG-"), "{uuid}");
        assert_eq!((raw.nvmlComputeInstanceDestroy.as_ref().unwrap())(ci), 0);
        assert_eq!((raw.nvmlGpuInstanceDestroy.as_ref().unwrap())(gi), 0);
    }
}

/// Both backends name the same device files for a MIG device and a whole
/// GPU: control, UVM, the GPU's minor, and the instance's two capability
/// files as `mig-minors` numbers them.
fn device_files_follow_nvidias_numbering(b: &dyn GpuBackend) {
    let h100 = b
        .inventory()
        .unwrap()
        .into_iter()
        .filter(|g| g.model.as_deref() == Some("H100-80GB"))
        .nth(1)
        .unwrap();
    let one_g = catalog::model("H100-80GB")
        .unwrap()
        .profile("1g.10gb")
        .unwrap()
        .nvml_id;
    let inst = b.create_instance(&h100.uuid, one_g, pl(0, 1)).unwrap();
    let nd = b.node_devices().expect("device numbering");
    let files = b
        .device_nodes(inst.device_uuid.as_deref().unwrap())
        .unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            std::path::Path::new(&f.path)
                .strip_prefix(&nd.dev_dir)
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    let gi = nd.mig_minors[&format!("gpu{}/gi{}/access", h100.index, inst.gi_id)];
    let ci = nd.mig_minors[&format!(
        "gpu{}/gi{}/ci{}/access",
        h100.index,
        inst.gi_id,
        inst.ci_id.unwrap_or(0)
    )];
    assert_eq!(
        names,
        vec![
            "nvidiactl".to_string(),
            "nvidia-uvm".into(),
            "nvidia-uvm-tools".into(),
            format!("nvidia{}", h100.index),
            format!("nvidia-caps/nvidia-cap{gi}"),
            format!("nvidia-caps/nvidia-cap{ci}"),
        ],
        "{}",
        b.kind()
    );
    let l40s = gpu(b, "L40S-48GB");
    let whole = b.device_nodes(&l40s.uuid).unwrap();
    assert_eq!(whole.len(), 4);
    assert!(whole[3].path.ends_with(&format!("/nvidia{}", l40s.index)));
    b.destroy_instance(&h100.uuid, inst.gi_id, Duration::ZERO)
        .unwrap();
}

#[test]
fn device_files_agree_on_both_backends() {
    let dir = std::env::temp_dir().join(format!("gpuslice-conf-dev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    device_files_follow_nvidias_numbering(&sim(Some(&dir)));
    let numbering = gpuslice::sched::devices::sim::prepare(&dir.join("nvml"), "n1", 4).unwrap();
    let (b, _) = nvml();
    device_files_follow_nvidias_numbering(&b.with_devices(numbering));
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------- what a real driver does (issue 20)

/// The stand-in copy `lib` as a library, with the device handles of its GPUs.
struct Driver {
    lib: libloading::Library,
    nvml: nvml_wrapper::Nvml,
}

impl Driver {
    fn open(lib: &std::path::Path) -> Driver {
        Driver {
            // SAFETY: the stand-in is a plain C library.
            lib: unsafe { libloading::Library::new(lib).unwrap() },
            nvml: nvml_wrapper::Nvml::builder()
                .lib_path(lib.as_os_str())
                .init()
                .unwrap(),
        }
    }

    fn handle(&self, i: u32) -> *mut std::ffi::c_void {
        // SAFETY: a handle NVML gave out, used only with this library.
        unsafe { self.nvml.device_by_index(i).unwrap().handle() as *mut std::ffi::c_void }
    }

    /// `gpusliceStandinConfigure`.
    fn configure(&self, ci_busy_ms: u64, hidden: &str, unprivileged: bool) {
        // SAFETY: the hook's prototype is (ulonglong, const char*, uint) -> uint.
        unsafe {
            let f: libloading::Symbol<
                unsafe extern "C" fn(u64, *const std::ffi::c_char, u32) -> u32,
            > = self.lib.get(b"gpusliceStandinConfigure").unwrap();
            let h = std::ffi::CString::new(hidden).unwrap();
            assert_eq!(f(ci_busy_ms, h.as_ptr(), u32::from(unprivileged)), 0);
        }
    }

    /// `gpusliceStandinForeign`: a GPU instance with `n` compute instances
    /// of compute-instance profile `ci_profile`, made behind our back.
    fn foreign(&self, gpu: u32, profile_id: u32, start: u32, ci_profile: u32, n: u32) -> u32 {
        // SAFETY: the hook's prototype is (device, uint, uint, uint, uint) -> uint.
        unsafe {
            let f: libloading::Symbol<
                unsafe extern "C" fn(*mut std::ffi::c_void, u32, u32, u32, u32) -> u32,
            > = self.lib.get(b"gpusliceStandinForeign").unwrap();
            f(self.handle(gpu), profile_id, start, ci_profile, n)
        }
    }
}

#[test]
fn destroy_waits_out_a_compute_instance_that_stays_busy() {
    let (b, lib) = nvml();
    let d = Driver::open(&lib);
    d.configure(400, "", false);
    let h100 = gpu(&b, "H100-80GB");
    let inst = b
        .create_instance(&h100.uuid, pid("H100-80GB", "1g.10gb"), pl(0, 1))
        .unwrap();
    let mut p = Command::new("sleep").arg("60").spawn().unwrap();
    // SAFETY: the hook's prototype is (const char*, uint, ulonglong) -> uint.
    unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn(*const std::ffi::c_char, u32, u64) -> u32> =
            d.lib.get(b"gpusliceStandinAttachProcess").unwrap();
        let c = std::ffi::CString::new(inst.device_uuid.clone().unwrap()).unwrap();
        assert_eq!(f(c.as_ptr(), p.id(), 1024), 0);
    }
    let started = std::time::Instant::now();
    let ended = b
        .destroy_instance(&h100.uuid, inst.gi_id, Duration::from_millis(200))
        .unwrap();
    let _ = p.wait();
    assert_eq!(ended.len(), 1, "the process was ended");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "the compute instance was busy after its process and the destroy waited"
    );
    assert!(b.instances(&h100.uuid).unwrap().is_empty(), "none leaked");
}

#[test]
fn instances_made_by_hand_are_seen_as_foreign_and_left_alone() {
    let (b, lib) = nvml();
    let d = Driver::open(&lib);
    let h100 = gpu(&b, "H100-80GB");
    // A 2g.20gb GPU instance at slices 2..4 with two 1-slice compute
    // instances (`nvidia-smi mig -cgi 14 -C` then `-cci 0,0`).
    assert_eq!(
        d.foreign(h100.index, pid("H100-80GB", "2g.20gb"), 2, 0, 2),
        0
    );
    let listed = b.instances(&h100.uuid).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let f = &listed[0];
    assert!(f.foreign, "{f:?}");
    assert_eq!(f.placement, pl(2, 2));
    assert_eq!(f.device_uuid, None, "not one of gpuslice's devices");
    // Its slots are taken: a create that overlaps them is refused by the
    // driver, one beside them works.
    assert!(b
        .create_instance(&h100.uuid, pid("H100-80GB", "2g.20gb"), pl(2, 2))
        .is_err());
    let ours = b
        .create_instance(&h100.uuid, pid("H100-80GB", "2g.20gb"), pl(0, 2))
        .unwrap();
    assert!(!ours.foreign);
    let both = b.instances(&h100.uuid).unwrap();
    assert_eq!(both.iter().filter(|i| i.foreign).count(), 1);
    // The mode is not switched while instances exist.
    let (switcher, _) = {
        let lib2 = lib.clone();
        (NvmlBackend::open(Some(&lib2), None, true).unwrap(), lib2)
    };
    assert_eq!(
        code(switcher.switch_mig_mode(&h100.uuid, false).unwrap_err()),
        19,
        "IN_USE while instances exist"
    );
}

#[test]
fn a_profile_the_driver_does_not_know_is_skipped() {
    let (b, lib) = nvml();
    let d = Driver::open(&lib);
    // An older driver without the A30's +me profiles.
    d.configure(0, "1g.6gb+me,2g.12gb+me", false);
    let a30 = gpu(&b, "A30-24GB");
    let made = b
        .create_instance(&a30.uuid, pid("A30-24GB", "1g.6gb"), pl(0, 1))
        .unwrap();
    let listed = b.instances(&a30.uuid).unwrap();
    assert_eq!(
        listed,
        vec![made],
        "the listing works past the unknown profiles"
    );
}

/// The stand-in answers the raw C calls with NVML's codes.
#[test]
fn the_standin_answers_with_nvmls_codes() {
    let (_b, lib) = nvml();
    let d = Driver::open(&lib);
    d.configure(0, "1g.6gb+me", false);
    // SAFETY: prototypes as in nvml.h; out-pointers are live locals.
    unsafe {
        let info: libloading::Symbol<
            unsafe extern "C" fn(*mut std::ffi::c_void, u32, *mut [u8; 64]) -> u32,
        > = d.lib.get(b"nvmlDeviceGetGpuInstanceProfileInfo").unwrap();
        let list: libloading::Symbol<
            unsafe extern "C" fn(
                *mut std::ffi::c_void,
                u32,
                *mut *mut std::ffi::c_void,
                *mut u32,
            ) -> u32,
        > = d.lib.get(b"nvmlDeviceGetGpuInstances").unwrap();
        let set_mode: libloading::Symbol<
            unsafe extern "C" fn(*mut std::ffi::c_void, u32, *mut u32) -> u32,
        > = d.lib.get(b"nvmlDeviceSetMigMode").unwrap();
        let mut buf = [0u8; 64];
        let h100 = d.handle(0);
        // Enums end with INVALID_ARGUMENT; an enum the GPU lacks is NOT_SUPPORTED.
        assert_eq!(info(h100, 0, &mut buf), 0);
        assert_eq!(info(h100, 0xA, &mut buf), INVALID_ARGUMENT);
        assert_eq!(
            info(h100, 5, &mut buf),
            NOT_SUPPORTED,
            "no 8-slice profile on an H100"
        );
        // A profile id the driver does not know: INVALID_ARGUMENT.
        let a30 = d.handle(2);
        let mut gis = [std::ptr::null_mut(); 8];
        let mut n = 8u32;
        assert_eq!(
            list(a30, pid("A30-24GB", "1g.6gb+me"), gis.as_mut_ptr(), &mut n),
            INVALID_ARGUMENT
        );
        // A MIG mode change waits for a reset: RESET_REQUIRED (16).
        let mut activation = 0u32;
        assert_eq!(set_mode(h100, 0, &mut activation), 0);
        assert_eq!(activation, 16);
        assert_eq!(set_mode(h100, 1, &mut activation), 0);
        assert_eq!(activation, 0, "back to the current mode: nothing pending");
    }
    d.configure(0, "", true);
    let b = NvmlBackend::open(Some(&lib), None, false).unwrap();
    let h100 = gpu(&b, "H100-80GB");
    assert_eq!(
        code(b.instances(&h100.uuid).unwrap_err()),
        4,
        "NO_PERMISSION"
    );
}
