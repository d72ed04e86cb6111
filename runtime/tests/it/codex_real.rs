//! `ac7 codex` against the real OpenAI Codex (`@openai/codex` from npm, installed once into
//! `<target dir>/tmp/codex-npm` under a lock — the target dir in use, so `CARGO_TARGET_DIR` and
//! `--target-dir` are honoured; `$AC7_TEST_CODEX` points at another codex binary).
//! `codex app-server` runs here without a login or network for what is checked: the generated
//! CODEX_HOME makes Codex start our bridge, list our tools and call `roster` through the runner
//! against a real broker (`ac7 codex --doctor`). Model turns run against a Responses-API stand-in
//! on loopback, configured as the user's own model provider (see [`standin`]).

#![allow(clippy::unwrap_used)]

use crate::broker_support;
use crate::common;
use common::turns::sigterm;
use common::wait_until_showing;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use broker_support::start_broker;
use serde_json::json;
use tokio::process::Command;

const CODEX_VERSION: &str = "0.169.0";

fn codex() -> PathBuf {
    static CODEX: OnceLock<PathBuf> = OnceLock::new();
    CODEX
        .get_or_init(|| {
            common::npm::npm_bin(
                "AC7_TEST_CODEX",
                "@openai/codex",
                CODEX_VERSION,
                "codex-npm",
                "codex",
            )
        })
        .clone()
}

/// `ac7 codex` as `builder` of `broker` with the real codex, stderr piped, logs at warn.
fn session(broker: &broker_support::TestBroker, cache: &Path, work: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ac7"));
    command
        .args(["codex", "--url", &broker.url])
        .current_dir(work)
        .env("AC7_TOKEN", broker.token("builder"))
        .env("CODEX_PATH", codex())
        .env("XDG_CACHE_HOME", cache)
        .env("AC7_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_starts_our_bridge_lists_our_tools_and_calls_roster() {
    let broker = start_broker().await;
    let cache = common::tempdir();
    let work = common::tempdir();
    let out = common::within(
        90,
        "ac7 codex --doctor",
        Command::new(env!("CARGO_BIN_EXE_ac7"))
            .args(["codex", "--doctor", "--url", &broker.url])
            .current_dir(work.path())
            .env("AC7_TOKEN", broker.token("builder"))
            .env("CODEX_PATH", codex())
            .env("XDG_CACHE_HOME", cache.path())
            .env("AC7_LOG", "warn")
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the ac7 MCP server is running with 19 tools"),
        "{stderr}"
    );
    assert!(stderr.contains("roster through codex: ok"), "{stderr}");
    assert!(
        stderr.contains("- builder (you) [engineer] connected="),
        "{stderr}"
    );
    let homes: Vec<_> = std::fs::read_dir(cache.path().join("ac7/codex"))
        .unwrap()
        .collect();
    assert!(
        homes.is_empty(),
        "the ephemeral CODEX_HOME is removed: {homes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_codex_is_a_clear_start_up_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["codex", "--url", "http://127.0.0.1:9"])
        .env("AC7_TOKEN", "ac7_x")
        .env("CODEX_PATH", "/nonexistent/codex")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("CODEX_PATH=/nonexistent/codex does not exist")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_session_with_143_and_removes_codex_home() {
    use tokio::io::AsyncBufReadExt;
    let broker = start_broker().await;
    let cache = common::tempdir();
    let work = common::tempdir();
    let mut child = session(&broker, cache.path(), work.path()).spawn().unwrap();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    common::within(60, "the codex session to start", async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("agent connected") {
                return;
            }
        }
        panic!("ac7 codex ended before its session started");
    })
    .await;
    assert_eq!(
        std::fs::read_dir(cache.path().join("ac7/codex"))
            .unwrap()
            .count(),
        1,
        "CODEX_HOME exists while running"
    );
    assert_eq!(sigterm(&mut child).await.code(), Some(143));
    assert_eq!(
        std::fs::read_dir(cache.path().join("ac7/codex"))
            .unwrap()
            .count(),
        0,
        "CODEX_HOME removed"
    );
}

/// A local stand-in for the OpenAI Responses API (`POST /v1/responses`, streamed SSE), playing a
/// model that reacts to the newest user message in the input (a message steered into a running
/// turn may land before or after a tool result) and to what the model already answered after it:
/// - it contains `FAIL-TURN`: HTTP 500 (the turn fails; retries are off);
/// - it contains `SEND-HELLO` and no call follows it yet: a call of the ac7 `send` tool — as Codex
///   0.169 lists MCP tools, in the namespace `mcp__ac7`
///   (`{"type":"function_call","namespace":"mcp__ac7","name":"send"}`);
/// - otherwise: an assistant message, turn over.
///
/// Every request body and its `authorization` header are recorded.
mod standin {
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};

    #[derive(Debug, Clone)]
    pub(crate) struct Request {
        pub(crate) body: Value,
        pub(crate) authorization: String,
    }

    impl Request {
        /// The newest user message's text, and the input items after it.
        pub(crate) fn newest_user(&self) -> Option<(String, Vec<Value>)> {
            let input = self.body["input"].as_array()?;
            let at = input
                .iter()
                .rposition(|i| i["type"] == "message" && i["role"] == "user")?;
            let text = input[at]["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n");
            Some((text, input[at + 1..].to_vec()))
        }

        /// The newest user message's text.
        pub(crate) fn last_user_text(&self) -> Option<String> {
            self.newest_user().map(|(text, _)| text)
        }
    }

    #[derive(Clone, Default)]
    pub(crate) struct StandIn {
        pub(crate) requests: Arc<Mutex<Vec<Request>>>,
        /// How long each answer waits before it is sent (none by default).
        pub(crate) delay: Arc<Mutex<std::time::Duration>>,
        /// When set, each answer waits until it turns true.
        pub(crate) gate: Option<tokio::sync::watch::Receiver<bool>>,
    }

    impl StandIn {
        /// Serves on 127.0.0.1; returns the base URL (`http://…/v1`).
        pub(crate) async fn start(&self) -> String {
            let app = axum::Router::new()
                .route("/v1/responses", axum::routing::post(responses))
                .with_state(self.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            format!("http://{addr}/v1")
        }

        /// Serves over TLS with `config` on 127.0.0.1; returns the port.
        pub(crate) async fn start_tls(&self, config: Arc<rustls::ServerConfig>) -> u16 {
            let app = axum::Router::new()
                .route("/v1/responses", axum::routing::post(responses))
                .with_state(self.clone());
            crate::trace_real::serve_tls(app, config).await.port()
        }

        pub(crate) fn requests(&self) -> Vec<Request> {
            self.requests.lock().unwrap().clone()
        }
    }

    fn sse(events: &[Value]) -> Response {
        let body: String = events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect();
        ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
    }

    async fn responses(State(s): State<StandIn>, headers: HeaderMap, body: Bytes) -> Response {
        let Ok(body) = serde_json::from_slice::<Value>(&body) else {
            return (StatusCode::BAD_REQUEST, "not JSON").into_response();
        };
        let request = Request {
            body,
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        };
        let n = {
            let mut requests = s.requests.lock().unwrap();
            requests.push(request.clone());
            requests.len()
        };
        let delay = *s.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if let Some(mut gate) = s.gate.clone() {
            let _ = gate.wait_for(|open| *open).await;
        }
        let (text, after) = request.newest_user().unwrap_or_default();
        let called = after.iter().any(|i| i["type"] == "function_call");
        let id = format!("resp_{n}");
        let item = if text.contains("FAIL-TURN") {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "stand-in: this turn fails",
            )
                .into_response();
        } else if text.contains("SEND-HELLO") && !called {
            json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"),
                   "namespace": "mcp__ac7", "name": "send",
                   "arguments": json!({"to": "director", "body": "hello from the stand-in model"}).to_string()})
        } else {
            json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"),
                   "content": [{"type": "output_text", "text": "noted"}]})
        };
        sse(&[
            json!({"type": "response.created", "response": {"id": id}}),
            json!({"type": "response.output_item.done", "item": item}),
            json!({"type": "response.completed", "response": {"id": id, "usage": {
                "input_tokens": 1, "input_tokens_details": null, "output_tokens": 1,
                "output_tokens_details": null, "total_tokens": 2}}}),
        ])
    }
}

/// With the user's own model provider (a Responses-API stand-in on loopback) merged into the
/// ephemeral config, a `--profile` layered over it and a `-c` override passed through: (a) a
/// push becomes a turn, (b) the model's `send` call reaches the broker, (c) a failed turn (HTTP
/// 500; codex then reports `systemError`) is told to the sender of what it carried and recorded
/// as a `turn_failed` activity event, and the next push is still delivered, (d) of a bundle codex
/// refuses, only the event it really refuses is reported to its sender by DM; the others reach
/// the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_turns_against_the_users_model_provider_survive_a_failed_turn() {
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncBufReadExt;

    let broker = start_broker().await;
    let model = standin::StandIn::default();
    let base_url = model.start().await;
    let user_home = common::tempdir();
    std::fs::write(
        user_home.path().join("config.toml"),
        format!(
            r#"# the user's own Codex config
model = "base-model"
model_provider = "standin"

[model_providers.standin]
name = "Responses stand-in"
base_url = "{base_url}"
wire_api = "responses"
env_key = "STANDIN_API_KEY"
request_max_retries = 0
stream_max_retries = 0

# Ours must win: with this entry codex could not reach the broker.
[mcp_servers.ac7]
command = "/nonexistent/ac7"
"#
        ),
    )
    .unwrap();
    std::fs::write(
        user_home.path().join("fast.config.toml"),
        "model = \"profile-model\"\n",
    )
    .unwrap();
    let cache = common::tempdir();
    let work = common::tempdir();
    // (d) needs five pushes in one delivery: a 1.5 s bundle window instead of 200 ms keeps that
    // true on a loaded machine.
    let mut child = session(&broker, cache.path(), work.path())
        .args(["--profile", "fast", "-c", "model_reasoning_effort=\"high\""])
        .args(["--bundle-window-ms", "1500"])
        .env("CODEX_HOME", user_home.path())
        .env("STANDIN_API_KEY", "standin-key")
        .spawn()
        .unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let sink = stderr.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    let log = || stderr.lock().unwrap().clone();
    let context = || {
        let inputs: Vec<String> = model
            .requests()
            .iter()
            .map(|r| {
                let input = r.body["input"].as_array().cloned().unwrap_or_default();
                let tail: Vec<String> = input
                    .iter()
                    .rev()
                    .take(3)
                    .map(|i| i.to_string().chars().take(160).collect())
                    .collect();
                format!("request, last items (newest first): {tail:?}")
            })
            .collect();
        format!(
            "ac7 codex stderr:\n{}\nstand-in:\n{}",
            log(),
            inputs.join("\n")
        )
    };
    let dm = async |body: &str| {
        broker
            .push("director", json!({"to": "builder", "body": body}))
            .await
    };
    let logged = async |what: &str, text: &str| {
        wait_until_showing(
            what,
            std::time::Duration::from_secs(60),
            context,
            async || log().contains(text).then_some(()),
        )
        .await;
    };
    let turn_with = async |what: &str, text: &str| {
        wait_until_showing(
            what,
            std::time::Duration::from_secs(60),
            context,
            async || {
                model
                    .requests()
                    .into_iter()
                    .find(|r| r.last_user_text().is_some_and(|t| t.contains(text)))
            },
        )
        .await
    };
    logged("the codex session to start", "agent connected").await;

    // (a) A push becomes a turn against the user's provider, profile and -c override.
    dm("please SEND-HELLO to me").await;
    let first = turn_with("a turn carrying the DM", "SEND-HELLO").await;
    let text = first.last_user_text().unwrap();
    assert!(
        text.starts_with("<channel from=\"director\" thread=\"dm\""),
        "{text}"
    );
    assert_eq!(
        first.body["model"], "profile-model",
        "the profile is layered"
    );
    assert_eq!(
        first.authorization, "Bearer standin-key",
        "the user's provider"
    );
    assert_eq!(
        first.body["reasoning"]["effort"], "high",
        "-c is passed to codex"
    );
    let ac7_tools = first.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type"] == "namespace" && t["name"] == "mcp__ac7")
        .unwrap_or_else(|| panic!("no mcp__ac7 namespace in {}", first.body["tools"]));
    assert!(
        ac7_tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "send"),
        "{ac7_tools}"
    );

    // (b) The model's send call reaches the broker as a DM from builder.
    wait_until_showing(
        "the model's DM in /history",
        std::time::Duration::from_secs(60),
        context,
        async || {
            let history = broker.get("/history?with=builder", "director").await;
            history.json["messages"]
                .as_array()?
                .iter()
                .any(|m| m["from"] == "builder" && m["body"] == "hello from the stand-in model")
                .then_some(())
        },
    )
    .await;

    // (c) A failed turn (HTTP 500) does not make the member deaf. (First let the model see the
    // tool result, so the failing text starts a turn of its own.)
    wait_until_showing(
        "the tool result to reach the model",
        std::time::Duration::from_secs(60),
        context,
        async || {
            model
                .requests()
                .iter()
                .any(|r| {
                    r.body["input"]
                        .as_array()
                        .and_then(|i| i.last())
                        .is_some_and(|l| l["type"] == "function_call_output")
                })
                .then_some(())
        },
    )
    .await;
    let failing = dm("FAIL-TURN now").await["id"].as_str().unwrap().to_owned();
    logged("codex to report the failed turn", "a codex turn failed").await;
    let told = wait_until_showing(
        "a turn-failed DM to the sender",
        std::time::Duration::from_secs(60),
        context,
        async || {
            notices_to_director(&broker)
                .await
                .into_iter()
                .find(|m| m["title"] == "turn failed")
        },
    )
    .await;
    assert_eq!(told["to"], "director");
    assert_eq!(told["level"], "warning");
    assert_eq!(told["data"]["undelivered"], failing.as_str());
    let recorded = wait_until_showing(
        "the failed turn in builder's activity",
        std::time::Duration::from_secs(30),
        context,
        async || {
            let activity = broker
                .get("/members/builder/activity?kind=turn_failed", "builder")
                .await;
            activity.json["activity"].as_array()?.first().cloned()
        },
    )
    .await;
    let event = &recorded["event"];
    assert_eq!(event["kind"], "turn_failed");
    assert_eq!(event["msgIds"], json!([failing]), "{recorded}");
    assert!(event["turnId"].as_str().is_some_and(|t| !t.is_empty()));
    // Codex's reason for the HTTP 500, the same in the DM and the activity event.
    let reason = event["reason"].as_str().unwrap();
    assert!(!reason.is_empty(), "{recorded}");
    assert_eq!(
        told["body"],
        format!(
            "your message {failing} reached builder, but the codex turn carrying it failed ({reason}), so builder may not have acted on it. Send it again later, or reach builder another way."
        )
    );
    dm("are you still there?").await;
    turn_with("a new turn after the failed one", "are you still there?").await;
    assert!(!log().contains("events not delivered"), "{}", log());
    assert_eq!(
        notices_to_director(&broker).await.len(),
        1,
        "one notice for the failed turn"
    );

    // (d) Codex refuses a bundle over its input limit (1 MiB of text): one push alone is over it
    // (a data value of 300 000 `<`, 1.2 M characters once escaped), pushed at once with a short
    // one and three of 64 KiB. The bundle is split; only the oversized push is refused.
    let short = broker
        .push(
            "director",
            json!({"to": "builder", "body": "short and sweet"}),
        )
        .await;
    let huge = broker.push(
        "director",
        json!({"to": "builder", "body": "huge", "data": {"blob": "<".repeat(300_000)}}),
    );
    let bigs = (0..3).map(|i| dm_owned(&broker, format!("big-{i}-{}", "x".repeat(65_000))));
    let (huge, _) = tokio::join!(huge, futures_util::future::join_all(bigs));
    let huge = huge["id"].as_str().unwrap().to_owned();
    let notice = wait_until_showing(
        "a not-delivered DM to the sender",
        std::time::Duration::from_secs(60),
        context,
        async || {
            notices_to_director(&broker)
                .await
                .into_iter()
                .find(|m| m["title"] == "not delivered")
        },
    )
    .await;
    assert_eq!(notice["to"], "director");
    assert_eq!(notice["level"], "warning");
    assert_eq!(notice["data"]["undelivered"], huge.as_str(), "{notice}");
    let body = notice["body"].as_str().unwrap();
    assert!(
        body.contains("was not delivered to builder: codex did not take it (")
            && body.contains("maximum length"),
        "{body}"
    );
    for text in [
        short["id"].as_str().unwrap().to_owned(),
        "big-0-".to_owned(),
        "big-1-".to_owned(),
        "big-2-".to_owned(),
    ] {
        wait_until_showing(
            "the pushes bundled with the refused one to reach the model",
            std::time::Duration::from_secs(60),
            context,
            async || {
                model
                    .requests()
                    .iter()
                    .any(|r| r.body["input"].to_string().contains(&text))
                    .then_some(())
            },
        )
        .await;
    }
    assert!(
        !model
            .requests()
            .iter()
            .any(|r| r.body["input"].to_string().contains(&huge)),
        "the refused push never reached the model"
    );
    let own = broker.get("/history?with=builder", "builder").await;
    assert!(
        !own.json["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["from"] == "builder" && m["to"] == "builder"),
        "the member never DMs itself"
    );

    assert_eq!(sigterm(&mut child).await.code(), Some(143), "{}", log());
}

/// A user config that is not TOML stops `ac7 codex` before anything is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_config_that_does_not_parse_is_a_clear_start_up_error() {
    let user_home = common::tempdir();
    let config = user_home.path().join("config.toml");
    std::fs::write(&config, "model = \"unterminated\n").unwrap();
    let cache = common::tempdir();
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["codex", "--url", "http://127.0.0.1:9"])
        .env("AC7_TOKEN", "ac7_x")
        .env("CODEX_PATH", "/bin/sh")
        .env("CODEX_HOME", user_home.path())
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "your Codex config {} is not valid TOML",
            config.display()
        )),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(cache.path()).unwrap().count(),
        0,
        "nothing created"
    );
}

/// The pids of `root`'s descendants, from `/proc/<pid>/stat`.
fn descendants(root: u32) -> Vec<u32> {
    let parent_of = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(") ")?;
        rest.split(' ').nth(1)?.parse().ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(all.iter().filter(|p| parent_of(**p) == Some(parent)));
        i += 1;
    }
    found.remove(0);
    found
}

/// Whether `pid` runs no more (gone, or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
    })
}

/// `ac7 codex` killed with SIGKILL: codex app-server and everything under it die with it, and
/// the next runner that starts removes the Codex home and trace CA files it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_runner_killed_by_sigkill_leaves_no_process_and_its_files_go_at_the_next_start() {
    use tokio::io::AsyncBufReadExt;
    let broker = start_broker().await;
    let cache = common::tempdir();
    let work = common::tempdir();
    let tmp = common::tempdir();
    let mut child = session(&broker, cache.path(), work.path())
        .env("TMPDIR", tmp.path())
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    common::within(60, "the codex session to start", async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("agent connected") {
                return;
            }
        }
        panic!("ac7 codex ended before its session started");
    })
    .await;
    let under = descendants(child.id().unwrap());
    assert!(!under.is_empty(), "codex app-server runs under the runner");
    let homes = cache.path().join("ac7/codex");
    let left_files = || -> Vec<String> {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("ac7-trace-"))
            .collect()
    };
    assert_eq!(std::fs::read_dir(&homes).unwrap().count(), 1);
    assert_eq!(
        left_files().len(),
        2,
        "the CA and the bundle: {:?}",
        left_files()
    );

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    wait_until_showing(
        "codex app-server and its children to die with the runner",
        std::time::Duration::from_secs(10),
        || {
            format!(
                "still running: {:?}",
                under.iter().filter(|p| !gone(**p)).collect::<Vec<_>>()
            )
        },
        async || under.iter().all(|p| gone(*p)),
    )
    .await;
    assert_eq!(
        std::fs::read_dir(&homes).unwrap().count(),
        1,
        "nothing of a killed runner cleans up"
    );

    let out = common::within(
        30,
        "the next runner",
        Command::new(env!("CARGO_BIN_EXE_ac7"))
            .args(["run", "--url", &broker.url, "--", "true"])
            .current_dir(work.path())
            .env("AC7_TOKEN", broker.token("builder"))
            .env("XDG_CACHE_HOME", cache.path())
            .env("TMPDIR", tmp.path())
            .output(),
    )
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(&homes).unwrap().count(),
        0,
        "the dead runner's Codex home is removed"
    );
    assert_eq!(
        left_files(),
        Vec::<String>::new(),
        "its CA files are removed"
    );
}

/// A revoked token under `ac7 codex`: codex gets a turn saying so (the stand-in model sees it),
/// one stderr line names the member, CODEX_HOME is removed, and the runner exits 77 within 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_a_turn_for_codex_and_exit_77() {
    use tokio::io::AsyncBufReadExt;
    let broker = start_broker().await;
    let model = standin::StandIn::default();
    let base_url = model.start().await;
    let user_home = common::tempdir();
    std::fs::write(
        user_home.path().join("config.toml"),
        format!(
            r#"model = "base-model"
model_provider = "standin"

[model_providers.standin]
name = "Responses stand-in"
base_url = "{base_url}"
wire_api = "responses"
env_key = "STANDIN_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"#
        ),
    )
    .unwrap();
    let cache = common::tempdir();
    let work = common::tempdir();
    let mut child = session(&broker, cache.path(), work.path())
        .env("CODEX_HOME", user_home.path())
        .env("STANDIN_API_KEY", "standin-key")
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    common::within(60, "the codex session to start", async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("agent connected") {
                return;
            }
        }
        panic!("ac7 codex ended before its session started");
    })
    .await;
    let stderr = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            all.push(line);
        }
        all
    });

    let rotated = broker
        .post("/members/builder/rotate-token", "director", json!({}))
        .await;
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    let status = common::within(20, "ac7 codex to exit after the revocation", child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(77));
    let stderr = stderr.await.unwrap();
    assert_eq!(
        stderr
            .iter()
            .filter(|l| l.starts_with("ac7: the token of member builder was revoked"))
            .count(),
        1,
        "{stderr:#?}"
    );
    assert!(
        model
            .requests()
            .iter()
            .filter_map(standin::Request::last_user_text)
            .any(|text| text.contains("builder's token was revoked")),
        "codex had a turn with the notice: {:#?}",
        model
            .requests()
            .iter()
            .map(|r| r.last_user_text())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        std::fs::read_dir(cache.path().join("ac7/codex"))
            .unwrap()
            .count(),
        0,
        "CODEX_HOME removed"
    );
}

/// A Codex home whose `config.toml` makes the stand-in at `base_url` the model provider
/// (no retries, so a failed request fails its turn at once).
fn standin_home(base_url: &str) -> tempfile::TempDir {
    let home = common::tempdir();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            r#"model = "base-model"
model_provider = "standin"

[model_providers.standin]
name = "Responses stand-in"
base_url = "{base_url}"
wire_api = "responses"
env_key = "STANDIN_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"#
        ),
    )
    .unwrap();
    home
}

/// The runner's stderr, collected as it comes.
fn collect_stderr(child: &mut tokio::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use tokio::io::AsyncBufReadExt;
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let sink = stderr.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    stderr
}

/// Pushes a DM from `director` to `builder`.
async fn dm_owned(broker: &broker_support::TestBroker, body: String) -> serde_json::Value {
    broker
        .push("director", json!({"to": "builder", "body": body}))
        .await
}

/// The messages `builder` sent `director` that carry a notice (`data.undelivered`).
async fn notices_to_director(broker: &broker_support::TestBroker) -> Vec<serde_json::Value> {
    let history = broker.get("/history?with=builder", "director").await;
    history.json["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["from"] == "builder" && m["data"]["undelivered"].is_string())
        .cloned()
        .collect()
}

/// A flood of pushes while the stand-in model ends each turn at once, with a bundle window of
/// 2 ms so that many deliveries steer a turn that is just ending: every push reaches Codex as
/// part of some turn's input, and no sender is told "not delivered".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_pushes_racing_the_ends_of_turns_all_reach_codex() {
    let broker = start_broker().await;
    let model = standin::StandIn::default();
    let base_url = model.start().await;
    let user_home = standin_home(&base_url);
    let cache = common::tempdir();
    let work = common::tempdir();
    let mut child = session(&broker, cache.path(), work.path())
        .args(["--bundle-window-ms", "2"])
        .env("CODEX_HOME", user_home.path())
        .env("STANDIN_API_KEY", "standin-key")
        .spawn()
        .unwrap();
    let stderr = collect_stderr(&mut child);
    let log = || stderr.lock().unwrap().clone();
    wait_until_showing(
        "the codex session to start",
        std::time::Duration::from_secs(60),
        log,
        async || log().contains("agent connected").then_some(()),
    )
    .await;

    const PUSHES: usize = 200;
    let asked = |i: usize| {
        let token = format!("flood-{i:03}");
        let requests = model.requests.lock().unwrap();
        requests
            .iter()
            .rev()
            .take(2)
            .any(|r| r.last_user_text().is_some_and(|t| t.contains(&token)))
    };
    for i in 0..PUSHES {
        broker
            .push(
                "director",
                json!({"to": "builder", "body": format!("flood-{i:03}")}),
            )
            .await;
        // The next push follows the model's answer to this one by 0 to 7 ms: the turn that
        // answer ends is ending (or just ended) when the next push arrives.
        let seen = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        while !asked(i) && tokio::time::Instant::now() < seen {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(i as u64 % 8)).await;
    }
    // Everything pushed is in the input of some model request (a thread's input carries its
    // earlier turns, so the newest requests hold the whole history).
    let missing = || -> Vec<usize> {
        let seen: String = model
            .requests()
            .iter()
            .map(|r| r.body["input"].to_string())
            .collect();
        (0..PUSHES)
            .filter(|i| !seen.contains(&format!("flood-{i:03}")))
            .collect()
    };
    wait_until_showing(
        "every push in some turn's input",
        std::time::Duration::from_secs(90),
        || format!("missing: {:?}\nac7 codex stderr:\n{}", missing(), log()),
        // A dropped push would never show up: stop waiting when one is reported.
        async || (missing().is_empty() || log().contains("events not delivered")).then_some(()),
    )
    .await;
    let notices = notices_to_director(&broker).await;
    assert!(notices.is_empty(), "{notices:#?}\n{}", log());
    assert!(!log().contains("events not delivered"), "{}", log());
    assert_eq!(sigterm(&mut child).await.code(), Some(143), "{}", log());
}

/// Traces follow Codex's model provider: with its `base_url` naming a gateway (a host that is
/// none of the default model hosts, resolved to a local TLS stand-in whose CA the runner is
/// given), a turn's model call goes through the runner's proxy, the member shows busy while
/// the gateway holds its answer, and the exchange is an `llm_exchange` row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_model_calls_to_a_gateway_are_traced_and_show_busy() {
    let broker = start_broker().await;
    let dir = common::tempdir();
    let ca = crate::trace_real::test_ca(dir.path(), "gateway.test");
    let (open, gate) = tokio::sync::watch::channel(false);
    let model = standin::StandIn {
        gate: Some(gate),
        ..Default::default()
    };
    let port = model.start_tls(ca.server.clone()).await;
    let user_home = standin_home(&format!("https://gateway.test:{port}/v1"));
    let cache = common::tempdir();
    let work = common::tempdir();
    let mut child = session(&broker, cache.path(), work.path())
        .env("CODEX_HOME", user_home.path())
        .env("STANDIN_API_KEY", "standin-key")
        .env(
            "AC7_TRACE_UPSTREAM",
            format!("gateway.test=127.0.0.1:{port}"),
        )
        .env("AC7_CA_CERT", &ca.pem_file)
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .env_remove("NO_PROXY")
        .spawn()
        .unwrap();
    let stderr = collect_stderr(&mut child);
    let log = || stderr.lock().unwrap().clone();
    wait_until_showing(
        "the codex session to start",
        std::time::Duration::from_secs(60),
        log,
        async || log().contains("agent connected").then_some(()),
    )
    .await;
    dm_owned(&broker, "hello over the gateway".into()).await;
    wait_until_showing(
        "builder busy on the roster",
        std::time::Duration::from_secs(60),
        log,
        async || {
            let roster = broker.get("/roster", "director").await;
            roster.json["connected"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["name"] == "builder" && m["busy"] == true)
                .then_some(())
        },
    )
    .await;
    open.send(true).unwrap();
    let entry = wait_until_showing(
        "an llm_exchange row",
        std::time::Duration::from_secs(60),
        log,
        async || {
            let rows = broker.get("/members/builder/activity", "builder").await;
            rows.json["activity"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["event"]["kind"] == "llm_exchange")
                .map(|r| r["event"]["entry"].clone())
        },
    )
    .await;
    assert_eq!(entry["request"]["model"], "base-model", "{entry}");
    assert!(
        model.requests().iter().any(|r| r
            .last_user_text()
            .is_some_and(|t| t.contains("hello over the gateway"))),
        "the gateway got the turn"
    );
    assert!(!entry.to_string().contains("standin-key"), "{entry}");
    assert_eq!(sigterm(&mut child).await.code(), Some(143), "{}", log());
}
