//! Issue 31, items 4 and 5, with real processes: what a server creates is private to its user
//! even under umask 022 (the repository's `RULES.md` follows the repository), and a home, a
//! `config.json` or a `local-token` another user could have planted stops every binary at start
//! with a message that names the path and the fix.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;
use zuno_tests::processes::binary;

/// A `zuno`-family binary under umask 022, the usual login default, with nothing from the
/// environment deciding where it stores things.
fn under_umask_022(name: &str) -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("umask 022; exec \"$0\" \"$@\"")
        .arg(binary(name))
        .env_remove("ZUNO_HOME")
        .env_remove("ZUNO_CONFIG")
        .env_remove("ZUNO_API_TOKEN")
        .env_remove("DATABASE_URL")
        .env_remove("ZUNO_DATABASE_URL")
        .env_remove("ZUNO_BIND")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every path under `dir`, `dir` included.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut paths = vec![dir.to_path_buf()];
    if dir.is_dir() {
        for entry in std::fs::read_dir(dir).unwrap() {
            paths.extend(walk(&entry.unwrap().path()));
        }
    }
    paths
}

#[tokio::test]
async fn a_server_under_umask_022_keeps_its_home_private_and_rules_follow_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let root = dir.path().join("src");
    let repo = root.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    chmod(&repo, 0o750);
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"server": {"worktree_roots": [root.display().to_string()]}}).to_string(),
    )
    .unwrap();
    let mut command = under_umask_022("zuno");
    command
        .env("ZUNO_HOME", &home)
        .env("ZUNO_CONFIG", &config)
        .args(["serve", "--all-in-one", "--bind", "127.0.0.1:0"]);
    let (_child, _, base, _stdout) = zuno_tests::processes::serve(
        &mut tokio::process::Command::from(command),
        Stdio::inherit(),
    )
    .await;
    let token = std::fs::read_to_string(home.join("local-token")).unwrap();
    let client = reqwest::Client::new();
    let post = |path: &str, body: serde_json::Value| {
        client
            .post(format!("{base}{path}"))
            .bearer_auth(token.trim())
            .json(&body)
            .send()
    };
    let created = post(
        "/api/projects",
        json!({"id": "p", "name": "P", "worktree": repo.display().to_string()}),
    )
    .await
    .unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    for target in ["project", "global"] {
        let written = post(
            "/api/projects/p/memory",
            json!({"target": target, "action": "add", "content": "Run cargo nextest.",
                   "reason": "the user said so", "confidence": 0.9, "origin": "user"}),
        )
        .await
        .unwrap();
        assert_eq!(written.status(), 201, "{}", written.text().await.unwrap());
    }

    let mut expected = vec![
        (home.clone(), 0o700),
        (home.join("zuno.db"), 0o600),
        (home.join("zuno.db-wal"), 0o600),
        (home.join("zuno.db-shm"), 0o600),
        (home.join("local-token"), 0o600),
        (home.join("memory"), 0o700),
        (home.join("memory/MEMORY.md"), 0o600),
    ];
    // The repository is 0750: its group may read it, so it may read the rules too; others
    // may not, and nobody but the owner may write.
    expected.extend([
        (repo.join(".zuno"), 0o750),
        (repo.join(".zuno/RULES.md"), 0o640),
    ]);
    for (path, want) in &expected {
        assert_eq!(mode(path), *want, "{} is {:o}", path.display(), mode(path));
    }
    let open: Vec<String> = walk(&home)
        .iter()
        .filter(|path| mode(path) & 0o077 != 0)
        .map(|path| format!("{} {:o}", path.display(), mode(path)))
        .collect();
    assert!(
        open.is_empty(),
        "group or other access under the home: {open:?}"
    );
}

/// Runs `command` to its end; returns its exit code and stderr.
fn refused(command: &mut Command) -> (i32, String) {
    let output = command
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn serve(home: &Path) -> Command {
    let mut command = under_umask_022("zuno");
    command
        .env("ZUNO_HOME", home)
        .args(["serve", "--bind", "127.0.0.1:0"]);
    command
}

/// A home where a `config.json` was planted: writable by everyone, the file widens the
/// worktree roots to `/`.
fn planted_home(dir: &Path) -> PathBuf {
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        home.join("config.json"),
        json!({"server": {"worktree_roots": ["/"], "allowed_hosts": ["evil.example"]}}).to_string(),
    )
    .unwrap();
    home
}

#[test]
fn a_world_or_group_writable_home_or_config_stops_every_binary() {
    let dir = tempfile::tempdir().unwrap();
    let home = planted_home(dir.path());
    chmod(&home, 0o777);
    let (code, stderr) = refused(&mut serve(&home));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("the data directory {}", home.display()))
            && stderr.contains("writable by every user")
            && stderr.contains(&format!("chmod go-w {}", home.display())),
        "{stderr}"
    );
    assert!(!home.join("zuno.db").exists(), "nothing was started");
    for worker in ["zuno-worker-extract", "zuno-worker-maintain"] {
        let (code, stderr) = refused(under_umask_022(worker).arg("--home").arg(&home));
        assert_ne!(code, 0, "{worker}: {stderr}");
        assert!(stderr.contains("chmod go-w"), "{worker}: {stderr}");
    }

    chmod(&home, 0o700);
    chmod(&home.join("config.json"), 0o664);
    let (code, stderr) = refused(&mut serve(&home));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the configuration file {}",
            home.join("config.json").display()
        )) && stderr.contains("writable by its group"),
        "{stderr}"
    );
    // Named explicitly, it is still refused while others may write to it.
    let (code, stderr) =
        refused(serve(&dir.path().join("fresh")).env("ZUNO_CONFIG", home.join("config.json")));
    assert_eq!(code, 2, "{stderr}");
}

/// Changing a file's owner needs root; as another user this test has nothing to do (the owner
/// rule is unit-tested on made-up metadata in `zuno_shared::ownership`).
#[test]
fn a_config_or_local_token_owned_by_another_user_stops_the_server() {
    if nix::unistd::geteuid().as_raw() != 0 {
        eprintln!("skipped: changing a file's owner needs root");
        return;
    }
    let other = 4242;
    let dir = tempfile::tempdir().unwrap();
    let home = planted_home(dir.path());
    chmod(&home, 0o700);
    std::os::unix::fs::chown(home.join("config.json"), Some(other), None).unwrap();
    let (code, stderr) = refused(&mut serve(&home));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the configuration file {}",
            home.join("config.json").display()
        )) && stderr.contains(&format!("owned by uid {other}"))
            && stderr.contains("chown 0"),
        "{stderr}"
    );

    std::fs::remove_file(home.join("config.json")).unwrap();
    let token = home.join("local-token");
    std::fs::write(&token, "zuno_planted\n").unwrap();
    chmod(&token, 0o600);
    std::os::unix::fs::chown(&token, Some(other), None).unwrap();
    assert_eq!(std::fs::metadata(&token).unwrap().uid(), other);
    let (code, stderr) = refused(&mut serve(&home));
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("the local token file {}", token.display()))
            && stderr.contains(&format!("owned by uid {other}")),
        "{stderr}"
    );

    // The whole home owned by someone else is refused before anything in it is read.
    std::fs::remove_file(&token).unwrap();
    std::os::unix::fs::chown(&home, Some(other), None).unwrap();
    let (code, stderr) = refused(&mut serve(&home));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("the data directory {}", home.display())),
        "{stderr}"
    );
}
