//! `cuda-burn`: keeps a GPU busy through the CUDA driver API the way the
//! CUDA runtime reaches it — `dlopen("libcuda.so.1")`, `dlsym` of
//! `cuGetProcAddress_v2` only, every other call through it — so that a
//! launch-layer shim is tested on the path real programs take.
//!
//! `cuda-burn [--seconds S | --launches N] [--kernel-us K] [--sync-every M]
//! [--alloc-mib A]` launches kernels of `gridDimX = K` (the stand-in runs
//! one for K µs) until S seconds or N launches, synchronising the context
//! every M launches (0: never; the driver's queue bounds it). With
//! `--alloc-mib` it first allocates A MiB in one call. Prints one JSON
//! line: launches, seconds, the mean time of a launch call in ns, the
//! allocation's result.

use std::ffi::{c_int, c_void, CString};
use std::time::{Duration, Instant};

use gpuslice_cuda::api::*;

fn arg(name: &str) -> Option<f64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| fail(&format!("{name}: not a number: {v}")))
        })
}

fn fail(msg: &str) -> ! {
    eprintln!("cuda-burn: {msg}");
    std::process::exit(2)
}

fn check(what: &str, r: CUresult) {
    if r != CUDA_SUCCESS {
        fail(&format!("{what} failed with CUresult {r}"));
    }
}

fn main() {
    let seconds = arg("--seconds");
    let launches = arg("--launches").map(|n| n as u64);
    let kernel_us = arg("--kernel-us").unwrap_or(500.0) as u32;
    let sync_every = arg("--sync-every").unwrap_or(0.0) as u64;
    let alloc_mib = arg("--alloc-mib");
    // SAFETY: the calls follow the CUDA driver API's signatures; every
    // pointer passed is a live local.
    unsafe {
        let lib = CString::new("libcuda.so.1").unwrap();
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            fail("cannot dlopen libcuda.so.1");
        }
        let gpa = CString::new("cuGetProcAddress_v2").unwrap();
        let gpa = libc::dlsym(h, gpa.as_ptr());
        if gpa.is_null() {
            fail("libcuda.so.1 has no cuGetProcAddress_v2");
        }
        let gpa: cuGetProcAddress_v2_t = std::mem::transmute(gpa);
        let get = |name: &str| -> *mut c_void {
            let c = CString::new(name).unwrap();
            let mut p = std::ptr::null_mut();
            let mut status: c_int = 0;
            check(name, gpa(c.as_ptr(), &mut p, 12040, 0, &mut status));
            p
        };
        let init: unsafe extern "C" fn(u32) -> CUresult = std::mem::transmute(get("cuInit"));
        let device_get: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult =
            std::mem::transmute(get("cuDeviceGet"));
        let ctx_create: unsafe extern "C" fn(*mut CUcontext, u32, CUdevice) -> CUresult =
            std::mem::transmute(get("cuCtxCreate"));
        let load: unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult =
            std::mem::transmute(get("cuModuleLoadData"));
        let function: unsafe extern "C" fn(
            *mut CUfunction,
            CUmodule,
            *const std::ffi::c_char,
        ) -> CUresult = std::mem::transmute(get("cuModuleGetFunction"));
        let launch: cuLaunchKernel_t = std::mem::transmute(get("cuLaunchKernel"));
        let sync: cuCtxSynchronize_t = std::mem::transmute(get("cuCtxSynchronize"));
        let alloc: cuMemAlloc_t = std::mem::transmute(get("cuMemAlloc"));
        let free: cuMemFree_t = std::mem::transmute(get("cuMemFree"));
        check("cuInit", init(0));
        let mut dev = 0;
        check("cuDeviceGet", device_get(&mut dev, 0));
        let mut ctx = std::ptr::null_mut();
        check("cuCtxCreate", ctx_create(&mut ctx, 0, dev));
        let image = b"// a PTX module\0";
        let mut module = std::ptr::null_mut();
        check("cuModuleLoadData", load(&mut module, image.as_ptr().cast()));
        let name = CString::new("burn").unwrap();
        let mut f = std::ptr::null_mut();
        check(
            "cuModuleGetFunction",
            function(&mut f, module, name.as_ptr()),
        );
        let mut alloc_result = serde_null();
        if let Some(mib) = alloc_mib {
            let mut ptr: CUdeviceptr = 0;
            let r = alloc(&mut ptr, (mib * 1024.0 * 1024.0) as usize);
            alloc_result = match r {
                CUDA_SUCCESS => "\"ok\"".to_string(),
                CUDA_ERROR_OUT_OF_MEMORY => "\"out_of_memory\"".to_string(),
                other => format!("\"error {other}\""),
            };
            if r == CUDA_SUCCESS && seconds.is_none() && launches.is_none() {
                check("cuMemFree", free(ptr));
            }
        }
        let start = Instant::now();
        let deadline = seconds.map(|s| start + Duration::from_secs_f64(s));
        let mut n: u64 = 0;
        let mut in_launch = Duration::ZERO;
        let running = |n: u64| match (deadline, launches) {
            (Some(d), _) => Instant::now() < d,
            (None, Some(max)) => n < max,
            (None, None) => false,
        };
        while running(n) {
            let t = Instant::now();
            check(
                "cuLaunchKernel",
                launch(
                    f,
                    kernel_us,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                ),
            );
            in_launch += t.elapsed();
            n += 1;
            if sync_every > 0 && n % sync_every == 0 {
                check("cuCtxSynchronize", sync());
            }
        }
        check("cuCtxSynchronize", sync());
        let secs = start.elapsed().as_secs_f64();
        let mean = if n > 0 {
            in_launch.as_nanos() as f64 / n as f64
        } else {
            0.0
        };
        println!(
            "{{\"launches\": {n}, \"seconds\": {secs:.3}, \"launch_ns_mean\": {mean:.1}, \"alloc\": {alloc_result}}}"
        );
    }
}

fn serde_null() -> String {
    "null".to_string()
}
