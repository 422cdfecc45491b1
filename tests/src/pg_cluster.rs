//! A private Postgres cluster a test may stop and start again (`scripts/pg-cluster`), for
//! outages of a real server: sessions ended by the administrator, then a socket that is gone.
//! Tests that only need a database use [`crate::TestDb`] instead, which shares one server.

use std::path::PathBuf;
use std::process::Command;

pub struct PgCluster {
    /// The cluster's directory (`ZUNO_TEST_PG_DIR`); its Unix socket lives here.
    pub dir: String,
    /// `postgres://…` over loopback TCP.
    pub url: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-cluster")
}

impl PgCluster {
    /// Starts a fresh cluster. Panics with the script's message when the Postgres 15 server
    /// binaries are missing.
    pub fn start() -> PgCluster {
        let output = Command::new(script())
            .arg("start")
            .output()
            .expect("run scripts/pg-cluster");
        assert!(
            output.status.success(),
            "scripts/pg-cluster start failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let exports = String::from_utf8_lossy(&output.stdout).into_owned();
        let value = |name: &str| {
            exports
                .lines()
                .find_map(|line| line.strip_prefix(&format!("export {name}=")))
                .map(|value| value.trim_matches('\'').to_owned())
                .unwrap_or_else(|| panic!("no {name} in: {exports}"))
        };
        PgCluster {
            dir: value("ZUNO_TEST_PG_DIR"),
            url: value("ZUNO_TEST_DATABASE_URL"),
        }
    }

    /// The same database over the cluster's Unix socket. While the server is down the socket
    /// file is gone, so a connection fails at once (as a host whose name no longer resolves
    /// does) instead of waiting out the pool's retries of refused TCP connections.
    pub fn socket_url(&self) -> String {
        let parsed = reqwest::Url::parse(&self.url).expect("cluster URL");
        format!(
            "postgres://postgres@localhost:{}/postgres?host={}",
            parsed.port().expect("cluster port"),
            self.dir
        )
    }

    fn run(&self, verb: &str) {
        let output = Command::new(script())
            .arg(verb)
            .env("ZUNO_TEST_PG_DIR", &self.dir)
            .output()
            .expect("run scripts/pg-cluster");
        assert!(
            output.status.success(),
            "scripts/pg-cluster {verb} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Stops the server (`pg_ctl stop -m fast`: sessions are ended), keeping its data.
    pub fn halt(&self) {
        self.run("halt");
    }

    /// Starts the halted server again and waits until it accepts connections.
    pub fn resume(&self) {
        self.run("resume");
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .env("ZUNO_TEST_PG_DIR", &self.dir)
            .output();
    }
}
