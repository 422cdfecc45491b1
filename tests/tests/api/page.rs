//! The dashboard page in headless Chromium (Debian `chromium`), driven over the DevTools
//! protocol: the page asks for the configured token, renders a pending memory candidate (whose
//! hostile text stays text), and a mouse click on Approve applies it, as the API then confirms.
//!
//! Chromium is spoken to over `--remote-debugging-pipe` (NUL-delimited JSON on fds 3 and 4;
//! a `sh` wrapper moves the piped stdin/stdout there), so no WebSocket client is needed. When
//! no Chromium is installed the test is skipped with a message, unless `ZUNO_REQUIRE_BROWSER`
//! is set (scripts/test sets it), where that is a failure.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use zuno_shared::config::{Config, MemoryPromotion};
use zuno_tests::TestDb;
use zuno_tests::server::TestServer;

const TOKEN: &str = "page-operator-token";
const DEADLINE: Duration = Duration::from_secs(60);
/// Untrusted memory text: rendered as text it is harmless; as markup it would run.
const HOSTILE: &str = "Use pnpm <img src=x onerror=\"window.__pwned=1\"> not npm.";

fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ZUNO_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| {
            ["chromium", "chromium-browser", "google-chrome"]
                .into_iter()
                .map(move |name| dir.join(name))
        })
        .find(|candidate| candidate.is_file())
}

/// A DevTools-protocol connection over Chromium's debugging pipe.
struct Browser {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn launch(chromium: &std::path::Path) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut command = Command::new("sh");
        command
            .arg("-c")
            // fd 3: commands to Chromium; fd 4: its replies.
            .arg("exec \"$@\" 3<&0 4>&1 </dev/null >/dev/null")
            .arg("sh")
            .arg(chromium)
            .args([
                "--headless=new",
                "--remote-debugging-pipe",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--window-size=1280,2000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("start chromium");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Browser {
            child,
            input,
            output,
            next_id: 0,
            session: None,
            _profile: profile,
        }
    }

    /// Sends one command (to the attached page, once there is one) and returns its result.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.input
            .write_all(&bytes)
            .await
            .expect("write to chromium");
        self.input.flush().await.expect("flush");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let mut frame = Vec::new();
            let read = tokio::time::timeout_at(deadline, self.output.read_until(0, &mut frame))
                .await
                .unwrap_or_else(|_| panic!("chromium did not answer `{method}`"))
                .expect("read from chromium");
            assert!(read > 0, "chromium closed the debugging pipe");
            if frame.last() == Some(&0) {
                frame.pop();
            }
            let reply: Value = serde_json::from_slice(&frame).expect("CDP message is JSON");
            if reply["id"].as_u64() != Some(id) {
                continue; // an event, or another session's reply
            }
            if let Some(error) = reply.get("error") {
                panic!("`{method}` failed: {error}");
            }
            return reply["result"].clone();
        }
    }

    async fn open(&mut self, url: &str) {
        let target = self
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = self
            .call(
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        self.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
        self.call("Page.enable", json!({})).await;
        self.call("Runtime.enable", json!({})).await;
        self.call("Page.navigate", json!({"url": url})).await;
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("`{expression}` threw: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// Waits, in the page, until `condition` (a JS expression) is truthy.
    async fn wait_for(&mut self, what: &str, condition: &str) {
        let ms = DEADLINE.as_millis();
        let script = format!(
            "new Promise((resolve) => {{ const end = Date.now() + {ms}; \
               const check = () => {{ let ok = false; try {{ ok = !!({condition}); }} catch (_) {{}} \
                 if (ok) resolve(true); else if (Date.now() > end) resolve(false); else setTimeout(check, 50); }}; \
               check(); }})"
        );
        if self.eval(&script).await != json!(true) {
            let status = self
                .eval("(document.getElementById('status') || {}).textContent || document.body.innerText")
                .await;
            panic!("the page never showed {what}; page says: {status}");
        }
    }

    /// A real mouse click (pressed and released) at the centre of the element `selector`.
    async fn click(&mut self, selector: &str) {
        let selector_json = serde_json::to_string(selector).unwrap();
        let rect = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({selector_json}); e.scrollIntoView({{block: 'center'}}); \
                   const r = e.getBoundingClientRect(); return {{x: r.x + r.width / 2, y: r.y + r.height / 2}}; }})()"
            ))
            .await;
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": rect["x"], "y": rect["y"], "button": "left", "clickCount": 1}),
            )
            .await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn operator(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = server
        .client
        .request(method, server.url(path))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    zuno_tests::server::decode(request.send().await.expect("request")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_approves_a_pending_memory_candidate_in_chromium() {
    let Some(chromium) = find_chromium() else {
        if std::env::var_os("ZUNO_REQUIRE_BROWSER").is_some() {
            panic!(
                "ZUNO_REQUIRE_BROWSER is set but no Chromium was found (install Debian `chromium`, see scripts/bootstrap, or set ZUNO_CHROMIUM)"
            );
        }
        eprintln!(
            "skipping the dashboard browser test: no `chromium` on PATH (set ZUNO_REQUIRE_BROWSER=1 to make this a failure)"
        );
        return;
    };
    let db = TestDb::sqlite().await;
    let mut config = Config::default();
    config.memory.promotion = MemoryPromotion::Review;
    let server = TestServer::start(&db, config, Some(TOKEN)).await;
    let worktree = tempfile::tempdir().expect("worktree");
    let (status, _) = operator(
        &server,
        reqwest::Method::POST,
        "/api/projects",
        Some(json!({"id": "p1", "name": "p1", "worktree": worktree.path()})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, proposed) = operator(
        &server,
        reqwest::Method::POST,
        "/api/projects/p1/memory",
        Some(
            json!({"target": "project", "action": "add", "content": HOSTILE,
            "reason": "the user prefers pnpm", "confidence": 0.95}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{proposed}");
    assert_eq!(
        proposed["applied"], false,
        "review promotion leaves it pending"
    );
    let candidate = proposed["candidate"]["id"].as_str().unwrap().to_owned();

    let mut browser = Browser::launch(&chromium).await;
    browser.open(&server.url("/")).await;

    // A token is configured: the page asks for it, then sends it as a Bearer header.
    browser
        .wait_for(
            "the token prompt",
            "!document.getElementById('auth').hidden",
        )
        .await;
    browser
        .eval("document.getElementById('token').focus()")
        .await;
    browser
        .call("Input.insertText", json!({"text": TOKEN}))
        .await;
    browser.click("#auth-form button[type=submit]").await;

    let button = format!("button.approve[data-candidate=\"{candidate}\"]");
    browser
        .wait_for(
            "the pending candidate",
            &format!(
                "document.querySelector({})",
                serde_json::to_string(&button).unwrap()
            ),
        )
        .await;
    // Every section loaded without an API error.
    browser
        .wait_for("a finished load", "document.body.dataset.loaded === 'true'")
        .await;
    assert_eq!(
        browser
            .eval("document.getElementById('status').textContent")
            .await,
        json!(""),
        "the page reported an error"
    );
    for section in ["queue", "jobs", "memory", "experiences", "skills"] {
        let text = browser
            .eval(&format!("document.getElementById('{section}').textContent"))
            .await;
        assert!(
            !text.as_str().unwrap_or_default().is_empty(),
            "section `{section}` is empty"
        );
    }
    // Untrusted text is text: it appears verbatim and no element was created from it.
    let shown = browser
        .eval(&format!(
            "document.querySelector('.candidate[data-candidate=\"{candidate}\"]').textContent"
        ))
        .await;
    assert!(
        shown.as_str().unwrap().contains("<img src=x"),
        "the candidate's text is shown literally: {shown}"
    );
    assert_eq!(
        browser
            .eval("[document.querySelectorAll('main img').length, window.__pwned === undefined]")
            .await,
        json!([0, true])
    );

    browser.click(&button).await;
    browser
        .wait_for(
            "the candidate leaving the pending list",
            &format!(
                "!document.querySelector('.candidate[data-candidate=\"{candidate}\"]') && \
                 document.getElementById('memory').textContent.includes('not npm.')"
            ),
        )
        .await;

    // The revision history renders the entries it added (it once showed `+ undefined`).
    browser
        .wait_for(
            "the revision history with the applied entry",
            "document.getElementById('memory').textContent.includes('+ Use pnpm')",
        )
        .await;
    let history = browser
        .eval("document.getElementById('memory').textContent")
        .await;
    assert!(
        !history.as_str().unwrap().contains("undefined"),
        "{history}"
    );

    // The API agrees: the candidate is applied and resident Memory holds the entry.
    let (status, applied) = operator(
        &server,
        reqwest::Method::GET,
        "/api/projects/p1/memory/candidates?state=applied",
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        applied
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == candidate.as_str()),
        "{applied}"
    );
    let (_, memory) = operator(
        &server,
        reqwest::Method::GET,
        "/api/projects/p1/memory",
        None,
    )
    .await;
    assert!(memory.to_string().contains("not npm."), "{memory}");
}

/// Opens the dashboard and signs in with the operator token.
async fn signed_in(chromium: &std::path::Path, server: &TestServer) -> Browser {
    let mut browser = Browser::launch(chromium).await;
    browser.open(&server.url("/")).await;
    browser
        .wait_for(
            "the token prompt",
            "!document.getElementById('auth').hidden",
        )
        .await;
    browser
        .eval("document.getElementById('token').focus()")
        .await;
    browser
        .call("Input.insertText", json!({"text": TOKEN}))
        .await;
    browser.click("#auth-form button[type=submit]").await;
    browser
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_approves_a_guard_audits_memory_and_unbinds_and_deletes_a_project() {
    let Some(chromium) = find_chromium() else {
        assert!(
            std::env::var_os("ZUNO_REQUIRE_BROWSER").is_none(),
            "ZUNO_REQUIRE_BROWSER is set but no Chromium was found"
        );
        eprintln!("skipping the dashboard browser test: no `chromium` on PATH");
        return;
    };
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), Some(TOKEN)).await;
    let worktree = tempfile::tempdir().expect("worktree");
    let (status, _) = operator(
        &server,
        reqwest::Method::POST,
        "/api/projects",
        Some(json!({"id": "p1", "name": "p1", "worktree": worktree.path()})),
    )
    .await;
    assert_eq!(status, 201);
    // A person's rule, applied at once; it compiles to a guard that waits for approval.
    let (status, proposed) = operator(
        &server,
        reqwest::Method::POST,
        "/api/projects/p1/memory",
        Some(
            json!({"target": "project", "action": "add", "content": "Use pnpm, not npm.",
            "reason": "the user's rule", "confidence": 0.95}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{proposed}");
    let (_, guards) = operator(
        &server,
        reqwest::Method::GET,
        "/api/projects/p1/guards",
        None,
    )
    .await;
    let guard = guards[0]["id"]
        .as_str()
        .expect("a compiled guard")
        .to_owned();
    assert_eq!(guards[0]["state"], "pending", "{guards}");

    let mut browser = signed_in(&chromium, &server).await;
    let approve = format!("button.approve[data-guard=\"{guard}\"]");
    browser
        .wait_for(
            "the pending guard",
            &format!(
                "document.querySelector({})",
                serde_json::to_string(&approve).unwrap()
            ),
        )
        .await;
    browser
        .wait_for("a finished load", "document.body.dataset.loaded === 'true'")
        .await;
    let audit = browser
        .eval("document.getElementById('audit').textContent")
        .await;
    assert!(
        audit.as_str().unwrap().contains("1 entries"),
        "the audit shows the document's size: {audit}"
    );
    browser.click(&approve).await;
    browser
        .wait_for(
            "the guard's Disable button",
            &format!("document.querySelector('button.disable[data-guard=\"{guard}\"]')"),
        )
        .await;
    let (_, guards) = operator(
        &server,
        reqwest::Method::GET,
        "/api/projects/p1/guards",
        None,
    )
    .await;
    assert_eq!(guards[0]["state"], "active", "{guards}");

    browser.click("#unbind-worktree").await;
    browser
        .wait_for(
            "the unbound worktree",
            "document.getElementById('worktree').textContent === 'not bound'",
        )
        .await;
    let (_, project) = operator(&server, reqwest::Method::GET, "/api/projects/p1", None).await;
    assert_eq!(project["worktree"], Value::Null, "{project}");

    // Deleting takes two clicks: the first only arms the button.
    browser.click("#delete-project").await;
    let (status, _) = operator(&server, reqwest::Method::GET, "/api/projects/p1", None).await;
    assert_eq!(status, 200, "one click deletes nothing");
    browser.click("#delete-project").await;
    browser
        .wait_for(
            "the project leaving the list",
            "!document.querySelector('#project option[value=\"p1\"]')",
        )
        .await;
    let (status, _) = operator(&server, reqwest::Method::GET, "/api/projects/p1", None).await;
    assert_eq!(status, 404);
}
