//! The commit quantgate is built from (`QUANTGATE_GIT_REV`, when built in a
//! git checkout): what `quantgate init --dependency git` pins the written
//! Cargo.toml and workflow to, so that a release repository builds the
//! same quantgate on GitHub.

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let rev = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(rev) = rev {
        println!("cargo:rustc-env=QUANTGATE_GIT_REV={rev}");
    }
}
