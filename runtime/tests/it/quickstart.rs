//! `ac7 quickstart`: the real binary starts a throw-away team whose demo agent (under the real
//! runner and bridge) answers a direct message; SIGINT stops it, exit 0, nothing left behind.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

const AC7: &str = env!("CARGO_BIN_EXE_ac7");

struct Quickstart(Child);

impl Drop for Quickstart {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn quickstart_agent_answers_a_push_and_ctrl_c_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let child = Command::new(AC7)
        .arg("quickstart")
        .env("TMPDIR", tmp.path())
        .env("AC7_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut qs = Quickstart(child);
    let stdout = qs.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let (mut url, mut token, mut dir, mut printed) = (None, None, None, String::new());
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("quickstart did not get ready:\n{printed}"));
        printed.push_str(&line);
        printed.push('\n');
        if let Some(u) = line.strip_prefix("broker: ") {
            url = Some(u.to_owned());
        }
        if let Some(t) = line.strip_prefix("director (you, an admin) token: ") {
            token = Some(t.to_owned());
        }
        if let Some(d) = line.strip_prefix("ac7 quickstart: a throw-away team in ") {
            dir = Some(PathBuf::from(d));
        }
        if line.starts_with("Ctrl-C stops") {
            break;
        }
    }
    let (url, token, dir) = (url.unwrap(), token.unwrap(), dir.unwrap());
    assert!(url.starts_with("http://127.0.0.1:"), "{printed}");
    // The web app's one-time sign-in setup URL is printed, and it is the broker's.
    let setup = printed
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&format!("{url}/setup?code=")))
        .unwrap_or_else(|| panic!("no web sign-in URL:\n{printed}"));
    let code = setup.rsplit('=').next().unwrap();
    assert!(code.len() >= 20, "{printed}");
    assert!(dir.starts_with(tmp.path()) && dir.is_dir(), "{printed}");
    // The printed commands carry the real URL and token.
    assert!(
        printed.contains(&format!(
            "AC7_URL={url} AC7_TOKEN={token} ac7 push --to builder --body \"hello\""
        )),
        "{printed}"
    );

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let resp = http
        .post(format!("{url}/push"))
        .bearer_auth(&token)
        .json(&json!({"to": "builder", "body": "are you there?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let history = std::cell::RefCell::new(Value::Null);
    let reply = crate::common::wait_until_showing(
        "a reply from the demo agent",
        Duration::from_secs(30),
        || format!("history: {}", history.borrow()),
        async || {
            let page: Value = http
                .get(format!("{url}/history?with=builder"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let reply = page["messages"].as_array().and_then(|msgs| {
                msgs.iter()
                    .find(|m| m["from"] == "builder" && m["to"] == "director")
                    .cloned()
            });
            *history.borrow_mut() = page;
            reply
        },
    )
    .await;
    assert!(
        reply["body"]
            .as_str()
            .unwrap()
            .contains("I got \"are you there?\""),
        "{reply}"
    );

    let pid = i32::try_from(qs.0.id()).unwrap();
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = crate::common::wait_until(
        "quickstart to stop on SIGINT",
        Duration::from_secs(20),
        async || qs.0.try_wait().unwrap(),
    )
    .await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!dir.exists(), "{} was left behind", dir.display());
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}
