//! Locating and running the workspace's binaries from tests.

use std::path::PathBuf;

/// Path of a binary built in this workspace's target directory (tests run from
/// `target/<profile>/deps`, binaries live in `target/<profile>`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "binary {} is missing; build the workspace first (`cargo build --workspace --bins`)",
        path.display()
    );
    path
}
