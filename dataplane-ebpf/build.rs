//! Rebuild the eBPF object when the linker changes (a new bpf-linker may emit different code).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
