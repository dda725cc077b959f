//! Puts the locked adk-rust version into the binary (ADK_RUST_VERSION), so
//! the report prints what was measured, read from this crate's Cargo.lock.
fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"adk-rust\""))
        .and_then(|p| p.lines().find(|l| l.starts_with("version = ")))
        .map(|l| {
            l.trim_start_matches("version = ")
                .trim_matches('"')
                .to_string()
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ADK_RUST_VERSION={version}");
}
