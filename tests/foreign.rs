//! A GPU instance made behind gpuslice's back (`nvidia-smi mig -cgi … -cci
//! …`) on a node driven through NVML (the stand-in library): reconcile
//! records it and leaves it, the audit log says so once, and placement
//! counts its memory slices as taken.

mod common;

use std::sync::{Arc, OnceLock};

use common::TestApp;
use gpuslice::booking;
use gpuslice::domain::booking::Status;
use gpuslice::gpu::nvml::NvmlBackend;
use gpuslice::gpu::GpuBackend;

const FLEET: &str = r#"
[[node]]
name = "f1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 1
"#;

fn standin() -> std::path::PathBuf {
    static ENV: OnceLock<()> = OnceLock::new();
    ENV.get_or_init(|| {
        let fleet = std::env::temp_dir().join(format!(
            "gpuslice-foreign-fleet-{}.toml",
            std::process::id()
        ));
        std::fs::write(&fleet, FLEET).unwrap();
        std::env::set_var("GPUSLICE_FLEET", &fleet);
    });
    common::standin_copy()
}

async fn book(
    app: &TestApp,
    who: &booking::Requester,
    profile: &str,
) -> gpuslice::db::bookings::Booking {
    common::book(app, who, "mig", profile, 1).await
}

#[tokio::test]
async fn a_foreign_instance_is_recorded_left_alone_and_its_slots_stay_taken() {
    let lib = standin();
    let backend = Arc::new(NvmlBackend::open(Some(&lib), None, false).unwrap());
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    sqlx::query("UPDATE tenants SET max_active_bookings = 10, max_gpu_memory_gib = 500, max_compute_slices = 50")
        .execute(&app.pool)
        .await
        .unwrap();
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    let dynb: Arc<dyn GpuBackend> = backend.clone();
    gpuslice::worker::report_inventory(&app.pool, "f1", dynb.clone(), |_| 4)
        .await
        .unwrap();
    // Somebody runs `nvidia-smi mig -cgi 2g.20gb` at slices 0..2 and splits
    // it into two 1-slice compute instances.
    let two_g = gpuslice::gpu::catalog::model("H100-80GB")
        .unwrap()
        .profile("2g.20gb")
        .unwrap()
        .nvml_id;
    // SAFETY: the stand-in's hook prototypes; handles come from NVML.
    unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(lib.as_os_str())
            .init()
            .unwrap();
        let h = nvml.device_by_index(0).unwrap().handle() as *mut std::ffi::c_void;
        let f: libloading::Symbol<
            unsafe extern "C" fn(*mut std::ffi::c_void, u32, u32, u32, u32) -> u32,
        > = l.get(b"gpusliceStandinForeign").unwrap();
        assert_eq!(f(h, two_g, 0, 0, 2), 0);
    }
    let settings = gpuslice::worker::bookings::Settings::default();
    for _ in 0..2 {
        gpuslice::worker::bookings::reconcile(&app.pool, "f1", dynb.clone(), &settings)
            .await
            .unwrap();
    }
    let gpu = backend.inventory().unwrap()[0].uuid.clone();
    let hardware = backend.instances(&gpu).unwrap();
    assert_eq!(hardware.len(), 1, "reconcile left it alone: {hardware:?}");
    assert!(hardware[0].foreign);
    let recorded: (String, i32, i32) =
        sqlx::query_as("SELECT profile, slice_start, slice_size FROM foreign_instances")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(recorded, ("2g.20gb".into(), 0, 2));
    let audited: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'reconcile.foreign_instance'")
        .await;
    assert_eq!(audited, 1, "reported once, not every reconcile");
    // Its slots are taken: a whole-GPU booking waits; a 3g.40gb goes
    // beside it, never over it.
    let whole = book(&app, &who, "7g.80gb").await;
    assert_eq!(whole.status, Status::Queued, "{whole:?}");
    let three = book(&app, &who, "3g.40gb").await;
    assert_eq!(three.status, Status::Scheduled, "{three:?}");
    assert!(three.slice_start.unwrap() >= 2, "{three:?}");
}
