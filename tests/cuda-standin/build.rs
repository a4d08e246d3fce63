//! Gives the stand-in the driver's soname and puts `libcuda.so.1` (the
//! name programs and the CUDA runtime `dlopen`) beside `libcuda.so`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
    if let Some(profile_dir) = std::env::var_os("OUT_DIR")
        .map(std::path::PathBuf::from)
        .and_then(|p| p.ancestors().nth(3).map(|p| p.to_path_buf()))
    {
        let link = profile_dir.join("libcuda.so.1");
        if std::fs::symlink_metadata(&link).is_err() {
            let _ = std::os::unix::fs::symlink("libcuda.so", &link);
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
