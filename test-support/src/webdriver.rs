//! A small W3C WebDriver client over `reqwest`, driving Debian's headless Chromium through
//! `chromedriver` for the web app's browser tests (and `ac7-bench web`).
//!
//! Written here rather than taken from a crate: the tests need a dozen endpoints (session,
//! navigate, find, click, send keys, text, attribute, execute script, cookies, screenshot),
//! which is ~200 lines over the `reqwest` we already have; the maintained clients
//! (fantoccini, thirtyfour) bring hyper-based stacks and many more dependencies.
//!
//! Chromium: `AC7_TEST_CHROMIUM` / `AC7_TEST_CHROMEDRIVER` override `/usr/bin/chromium` and
//! `/usr/bin/chromedriver` (Debian's `chromium` and `chromium-driver`, installed by `.ci/run`).
//! Without them a test skips with a loud message, except under `CI=true` where it fails.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// The element reference key of the W3C protocol.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Paths of the browser and its driver, or `None` (after saying why) when the test should skip.
pub fn chromium() -> Option<(PathBuf, PathBuf)> {
    let browser = std::env::var_os("AC7_TEST_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    let driver = std::env::var_os("AC7_TEST_CHROMEDRIVER")
        .map_or_else(|| PathBuf::from("/usr/bin/chromedriver"), PathBuf::from);
    if browser.exists() && driver.exists() {
        return Some((browser, driver));
    }
    let msg = format!(
        "chromium or chromedriver missing ({} / {}): install Debian's `chromium chromium-driver` \
         (as .ci/run does) or set AC7_TEST_CHROMIUM / AC7_TEST_CHROMEDRIVER",
        browser.display(),
        driver.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("\n*** SKIPPED: {msg} ***\n");
    None
}

/// A running chromedriver with one headless Chromium session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

/// A WebDriver error answer.
#[derive(Debug)]
pub struct WdError(pub String);

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session (1280×900).
    pub async fn start(browser: &Path, driver: &Path) -> Browser {
        Browser::start_sized(browser, driver, 1280, 900).await
    }

    pub async fn start_sized(browser: &Path, driver: &Path, width: u32, height: u32) -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        // Its own process group, so that a test that panics takes Chromium down with the
        // driver (see `Drop`): killing chromedriver alone would leave the browser running.
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver.display()));
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        // Wait for the driver to listen.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = http.get(format!("{base}/status")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let mut options = json!({
            "binary": browser.to_string_lossy(),
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--mute-audio",
                format!("--window-size={},{height}", width.max(500)),
                format!("--user-data-dir={}", profile.path().display()),
            ],
        });
        // Chromium's windows are at least 500 px wide: narrower viewports (phones) are
        // emulated, as a touch screen.
        if width < 500 {
            options["mobileEmulation"] = json!({"deviceMetrics": {
                "width": width, "height": height, "pixelRatio": 1.0, "touch": true,
            }});
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": options,
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver refused a session: {r}"))
            .to_owned();
        Browser {
            driver: child,
            base,
            session,
            http,
            _profile: profile,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, WdError> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let req = self.http.request(method.parse().unwrap(), url);
        let req = match body {
            Some(b) => req.json(&b),
            None if method == "POST" => req.json(&json!({})),
            None => req,
        };
        let resp = req.send().await.map_err(|e| WdError(e.to_string()))?;
        let ok = resp.status().is_success();
        let v: Value = resp.json().await.map_err(|e| WdError(e.to_string()))?;
        if ok {
            Ok(v["value"].clone())
        } else {
            Err(WdError(format!(
                "{} {path}: {}",
                v["value"]["error"], v["value"]["message"]
            )))
        }
    }

    async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("webdriver: {}", e.0))
    }

    pub async fn goto(&self, url: &str) {
        self.ok("POST", "/url", Some(json!({"url": url}))).await;
    }

    /// Deletes every cookie of the page shown.
    pub async fn delete_cookies(&self) {
        self.ok("DELETE", "/cookie", None).await;
    }

    /// Cuts the browser off the network (Chromium's network emulation), or restores it.
    pub async fn set_offline(&self, offline: bool) {
        self.ok(
            "POST",
            "/chromium/network_conditions",
            Some(json!({"network_conditions": {
                "offline": offline, "latency": 0,
                "download_throughput": -1, "upload_throughput": -1,
            }})),
        )
        .await;
    }

    /// Sets a permission of the page's origin (W3C Permissions: WebDriver "Set Permission"),
    /// e.g. `notifications` to `granted`.
    pub async fn set_permission(&self, name: &str, state: &str) {
        self.ok(
            "POST",
            "/permissions",
            Some(json!({"descriptor": {"name": name}, "state": state})),
        )
        .await;
    }

    pub async fn refresh(&self) {
        self.ok("POST", "/refresh", None).await;
    }

    pub async fn url(&self) -> String {
        self.ok("GET", "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn title(&self) -> String {
        self.ok("GET", "/title", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Sets a cookie on the current page's origin (navigate there first).
    pub async fn add_cookie(&self, name: &str, value: &str) {
        self.ok(
            "POST",
            "/cookie",
            Some(json!({"cookie": {"name": name, "value": value, "path": "/", "httpOnly": true}})),
        )
        .await;
    }

    /// The first element matching `css`, if any.
    pub async fn find(&self, css: &str) -> Option<Element<'_>> {
        let v = self
            .call(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
            .ok()?;
        Some(Element {
            b: self,
            id: v[ELEMENT].as_str()?.to_owned(),
        })
    }

    /// Every element matching `css`.
    pub async fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let v = self
            .ok(
                "POST",
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str())
                    .map(|id| Element {
                        b: self,
                        id: id.to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (≤ `secs`) for an element matching `css`; panics naming `what` on timeout.
    pub async fn wait_for(&self, css: &str, secs: u64, what: &str) -> Element<'_> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(e) = self.find(css).await {
                return e;
            }
            if Instant::now() > deadline {
                self.timed_out(secs, &format!("{what} ({css})")).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the element matching `css`, waiting (≤ `secs`) for it to exist and be
    /// clickable. The app re-renders parts of the page when live data arrives, so a node
    /// found a moment ago may be replaced before the click lands ("stale element"); the
    /// selector is then looked up again instead of failing on the old node.
    pub async fn click_on(&self, css: &str, secs: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let last = match self.find(css).await {
                Some(e) => match self
                    .call("POST", &format!("/element/{}/click", e.id), None)
                    .await
                {
                    Ok(_) => return,
                    Err(e) if is_retryable(&e.0) => e.0,
                    Err(e) => panic!("webdriver: clicking {what} ({css}): {}", e.0),
                },
                None => "not on the page".to_owned(),
            };
            if Instant::now() > deadline {
                self.timed_out(secs, &format!("a click on {what} ({css}): {last}"))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (≤ `secs`) until `script` (a function body returning a value) returns truthy.
    pub async fn wait_until(&self, script: &str, secs: u64, what: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.script(script, json!([])).await;
            if !(v.is_null() || v == json!(false) || v == json!("") || v == json!(0)) {
                return v;
            }
            if Instant::now() > deadline {
                self.timed_out(secs, what).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Panics with what was awaited, the URL and the text on the page.
    async fn timed_out(&self, secs: u64, what: &str) -> ! {
        let body = self
            .script(
                "return document.body ? document.body.innerText : ''",
                json!([]),
            )
            .await;
        panic!(
            "timed out after {secs} s waiting for {what}; page {} shows: {body}",
            self.url().await
        );
    }

    /// Runs `body` (a function body) with `args`; returns its value.
    pub async fn script(&self, body: &str, args: Value) -> Value {
        self.ok(
            "POST",
            "/execute/sync",
            Some(json!({"script": body, "args": args})),
        )
        .await
    }

    /// Runs `body` asynchronously: it gets its callback as the last argument.
    pub async fn script_async(&self, body: &str, args: Value) -> Value {
        self.ok(
            "POST",
            "/execute/async",
            Some(json!({"script": body, "args": args})),
        )
        .await
    }

    /// A PNG of the viewport, written to `target/web-screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine as _;
        let v = self.ok("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap();
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// The browser's console/JS errors would go here; chromedriver's log endpoint is not W3C.
    pub async fn quit(mut self) {
        let _ = self.call("DELETE", "", None).await;
        let _ = self.driver.kill().await;
    }
}

impl Drop for Browser {
    /// Kills chromedriver's process group: the driver and every browser process it started,
    /// also when the test panicked before `quit`.
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: killpg only sends a signal; the group is the one this helper created.
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
    }
}

/// `target/web-screenshots/` of this workspace.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    target.join("web-screenshots")
}

/// One element of the page.
pub struct Element<'a> {
    b: &'a Browser,
    id: String,
}

impl Element<'_> {
    pub async fn click(&self) {
        self.b
            .ok("POST", &format!("/element/{}/click", self.id), None)
            .await;
    }

    /// Types `text` into the element (a file input takes a local path).
    pub async fn send_keys(&self, text: &str) {
        self.b
            .ok(
                "POST",
                &format!("/element/{}/value", self.id),
                Some(json!({"text": text})),
            )
            .await;
    }

    pub async fn clear(&self) {
        self.b
            .ok("POST", &format!("/element/{}/clear", self.id), None)
            .await;
    }

    pub async fn text(&self) -> String {
        self.b
            .ok("GET", &format!("/element/{}/text", self.id), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn attr(&self, name: &str) -> Option<String> {
        self.b
            .ok(
                "GET",
                &format!("/element/{}/attribute/{name}", self.id),
                None,
            )
            .await
            .as_str()
            .map(str::to_owned)
    }
}

/// WebDriver errors that mean "the page moved under the click; look again".
fn is_retryable(err: &str) -> bool {
    [
        "stale element reference",
        "element click intercepted",
        "element not interactable",
    ]
    .iter()
    .any(|k| err.contains(k))
}
