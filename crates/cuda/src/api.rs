//! The CUDA driver API as far as gpuslice uses it: result codes, handle
//! types and the signatures of the calls the shim interposes and the
//! stand-in implements. Source: NVIDIA, *CUDA Driver API* reference
//! (docs.nvidia.com/cuda/cuda-driver-api), sections "Data types used by
//! CUDA driver", "Error Handling", "Execution Control", "Memory
//! Management", "Event Management" and "Driver Entry Point Access".
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CUresult`.
pub type CUresult = c_uint;
pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;

/// `CUdevice` (an ordinal), `CUdeviceptr` (a device address).
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
/// Opaque handles.
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

/// `cuGetProcAddress` flags (`CUdriverProcAddress_flags`): `DEFAULT` 0,
/// `LEGACY_STREAM` 1 << 0, `PER_THREAD_DEFAULT_STREAM` 1 << 1 (the
/// `_ptsz` / `_ptds` variants).
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
/// `CUstreamCaptureStatus`: not capturing.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CUdriverProcAddressQueryResult` (CUDA 12's `cuGetProcAddress_v2`).
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;

/// `CUlaunchConfig` of `cuLaunchKernelEx` (CUDA 12.0).
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `CUmemAllocationProp` is only passed through; its size is the driver's.
pub type CUmemAllocationProp = c_void;

pub type cuLaunchKernel_t = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub type cuLaunchKernelEx_t = unsafe extern "C" fn(
    *const CUlaunchConfig,
    CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub type cuLaunchCooperativeKernel_t = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
) -> CUresult;
pub type cuGraphLaunch_t = unsafe extern "C" fn(CUgraphExec, CUstream) -> CUresult;
pub type cuMemAlloc_t = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
pub type cuMemAllocPitch_t =
    unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
pub type cuMemAllocManaged_t = unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
pub type cuMemAllocAsync_t = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
pub type cuMemFree_t = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
pub type cuMemFreeAsync_t = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
pub type cuMemGetInfo_t = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub type cuMemCreate_t = unsafe extern "C" fn(
    *mut CUmemGenericAllocationHandle,
    usize,
    *const CUmemAllocationProp,
    u64,
) -> CUresult;
pub type cuMemRelease_t = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
pub type cuCtxSynchronize_t = unsafe extern "C" fn() -> CUresult;
pub type cuStreamSynchronize_t = unsafe extern "C" fn(CUstream) -> CUresult;
pub type cuStreamIsCapturing_t = unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult;
pub type cuEventCreate_t = unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult;
pub type cuEventRecord_t = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
pub type cuEventQuery_t = unsafe extern "C" fn(CUevent) -> CUresult;
pub type cuEventSynchronize_t = unsafe extern "C" fn(CUevent) -> CUresult;
pub type cuEventElapsedTime_t = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
pub type cuEventDestroy_t = unsafe extern "C" fn(CUevent) -> CUresult;
/// CUDA 11.3–11.8's `cuGetProcAddress` (four arguments).
pub type cuGetProcAddress_t =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
/// CUDA 12's `cuGetProcAddress_v2` (a fifth argument: the query result).
pub type cuGetProcAddress_v2_t =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
