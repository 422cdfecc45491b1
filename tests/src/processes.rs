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

/// Fails the test with the child's stderr unless it exited successfully.
#[track_caller]
pub fn assert_succeeded(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The rest of a child's stdout, line by line.
pub type StdoutLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// Spawns `command` (a `zuno serve …`) with stdout piped, `stderr` as given and killed on drop,
/// and waits up to a minute for its banner. Returns the child, the banner (the first line), the
/// base URL it names (`http://…`) and the rest of stdout.
pub async fn serve(
    command: &mut tokio::process::Command,
    stderr: std::process::Stdio,
) -> (tokio::process::Child, String, String, StdoutLines) {
    use tokio::io::AsyncBufReadExt;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("zuno serve spawns");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let banner = tokio::time::timeout(std::time::Duration::from_secs(60), lines.next_line())
        .await
        .expect("the server starts in time")
        .expect("its stdout is readable")
        .expect("it prints a banner");
    let base = banner_address(&banner);
    (child, banner, base, lines)
}

/// The base URL (`http://…`) that a `zuno serve` banner names.
fn banner_address(banner: &str) -> String {
    banner
        .split_whitespace()
        .find(|word| word.starts_with("http://"))
        .expect("the banner names the address")
        .to_owned()
}
