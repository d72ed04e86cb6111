//! `ac7 acp` with real ACP agents, offline, each from npm (installed once into
//! `<target dir>/tmp/<name>-npm`), each with a home of its own; the broker is a real one on
//! 127.0.0.1:
//! - Claude Code's ACP adapter (`@zed-industries/claude-code-acp`; `$AC7_TEST_CLAUDE_ACP`
//!   points at another binary) with `ANTHROPIC_BASE_URL` at a local stand-in of the Messages
//!   API ([`standin`]). As root, claude needs `IS_SANDBOX=1`;
//! - Gemini CLI (`@google/gemini-cli`, `gemini --acp`; `$AC7_TEST_GEMINI`) with
//!   `GOOGLE_GEMINI_BASE_URL` at a local stand-in of the Gemini API ([`gemini_standin`]).

#![allow(clippy::unwrap_used)]

use crate::broker_support;
use crate::common;
use crate::common::turns::{history, sigterm};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_support::{TestBroker, start_broker};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The claude-code-acp version the tests run.
const CLAUDE_ACP_VERSION: &str = "0.16.2";

fn claude_code_acp() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        common::npm::npm_bin(
            "AC7_TEST_CLAUDE_ACP",
            "@zed-industries/claude-code-acp",
            CLAUDE_ACP_VERSION,
            "claude-acp-npm",
            "claude-code-acp",
        )
    })
    .clone()
}

/// A local stand-in of the Anthropic Messages API (`POST /v1/messages`, streamed SSE), playing
/// a model that reacts to the newest user message of a request with tools (a turn of the
/// agent's):
/// - it holds a `tool_result`: text `done`;
/// - it contains `please fail`: HTTP 400 (not retried: the turn fails);
/// - it contains `SEND-HELLO`: a call of the ac7 `send` tool (`mcp__ac7__send`) sending
///   `hello from the stand-in model` to director;
/// - otherwise: text `noted`.
///
/// Requests without tools (Claude Code's side calls) get text `ok`. The newest user message of
/// every request with tools is recorded.
mod standin {
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};

    #[derive(Clone, Default)]
    pub(crate) struct StandIn {
        /// The newest user message's text, of each request with tools.
        pub(crate) turns: Arc<Mutex<Vec<String>>>,
    }

    impl StandIn {
        /// Serves on 127.0.0.1; returns the base URL.
        pub(crate) async fn start(&self) -> String {
            let app = axum::Router::new()
                .route("/v1/messages", axum::routing::post(messages))
                .route("/", axum::routing::any(|| async { StatusCode::OK }))
                .with_state(self.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            format!("http://{addr}")
        }

        pub(crate) fn turns(&self) -> Vec<String> {
            self.turns.lock().unwrap().clone()
        }
    }

    /// The text of a message's content, its last text block (claude joins the prompt of a
    /// failed turn with the next one's), and whether it holds a tool result.
    fn text_of(message: &Value) -> (String, String, bool) {
        match &message["content"] {
            Value::String(s) => (s.clone(), s.clone(), false),
            Value::Array(blocks) => {
                let texts: Vec<&str> = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
                (
                    texts.join("\n"),
                    texts.last().copied().unwrap_or_default().to_owned(),
                    blocks.iter().any(|b| b["type"] == "tool_result"),
                )
            }
            _ => (String::new(), String::new(), false),
        }
    }

    fn sse(model: &str, block: &Value, delta: &Value, stop: &str) -> Response {
        let events = [
            json!({"type": "message_start", "message": {"id": "msg_standin", "type": "message",
                "role": "assistant", "model": model, "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": block}),
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                "usage": {"output_tokens": 5}}),
            json!({"type": "message_stop"}),
        ];
        let body: String = events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect();
        ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
    }

    fn text(model: &str, text: &str) -> Response {
        sse(
            model,
            &json!({"type": "text", "text": ""}),
            &json!({"type": "text_delta", "text": text}),
            "end_turn",
        )
    }

    async fn messages(State(s): State<StandIn>, body: Bytes) -> Response {
        let request: Value = serde_json::from_slice(&body).unwrap_or_default();
        let model = request["model"]
            .as_str()
            .unwrap_or("claude-stand-in")
            .to_owned();
        let with_tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
        if !with_tools {
            return text(&model, "ok");
        }
        let newest = request["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .map(text_of)
            .unwrap_or_default();
        let (user, last, tool_result) = newest;
        s.turns.lock().unwrap().push(user);
        if tool_result {
            text(&model, "done")
        } else if last.contains("please fail") {
            let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "the stand-in refuses this prompt"}});
            (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
        } else if last.contains("SEND-HELLO") {
            let input = json!({"to": "director", "body": "hello from the stand-in model"});
            sse(
                &model,
                &json!({"type": "tool_use", "id": "toolu_standin", "name": "mcp__ac7__send", "input": {}}),
                &json!({"type": "input_json_delta", "partial_json": input.to_string()}),
                "tool_use",
            )
        } else {
            text(&model, "noted")
        }
    }
}

/// The Gemini CLI version the tests run.
const GEMINI_VERSION: &str = "0.61.0";

fn gemini() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        common::npm::npm_bin(
            "AC7_TEST_GEMINI",
            "@google/gemini-cli",
            GEMINI_VERSION,
            "gemini-npm",
            "gemini",
        )
    })
    .clone()
}

/// A local stand-in of the Gemini API, written from the requests Gemini CLI sends:
/// `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` (the turns; SSE, `data:` lines),
/// `:generateContent` (its side calls, e.g. routing: answered `{}` as text) and `:countTokens`.
/// A streamed request plays a model that reacts to the last text part of the newest user
/// content:
/// - the content holds a `functionResponse`: text `done`;
/// - `please fail`: HTTP 400 (`INVALID_ARGUMENT`);
/// - `SEND-HELLO`: a `functionCall` of the ac7 `send` tool (the declaration named `send`, or
///   ending in `ac7__send` / `ac7_send`) sending `hello from the stand-in model` to director;
/// - otherwise: text `noted`.
///
/// The newest user content's text of every streamed request is recorded, and the names of the
/// functions it declared.
mod gemini_standin {
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::extract::{Path, State};
    use axum::http::{StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};

    #[derive(Clone, Default)]
    pub(crate) struct StandIn {
        pub(crate) turns: Arc<Mutex<Vec<String>>>,
        pub(crate) functions: Arc<Mutex<Vec<String>>>,
    }

    impl StandIn {
        pub(crate) async fn start(&self) -> String {
            let app = axum::Router::new()
                .route("/v1beta/models/{*call}", axum::routing::post(models))
                .with_state(self.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            format!("http://{addr}")
        }

        pub(crate) fn turns(&self) -> Vec<String> {
            self.turns.lock().unwrap().clone()
        }
    }

    fn chunk(parts: Value) -> Value {
        json!({"candidates": [{"content": {"role": "model", "parts": parts},
            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 1, "totalTokenCount": 6}})
    }

    fn stream(parts: Value) -> Response {
        let body = format!("data: {}\r\n\r\n", chunk(parts));
        ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
    }

    async fn models(State(s): State<StandIn>, Path(call): Path<String>, body: Bytes) -> Response {
        let request: Value = serde_json::from_slice(&body).unwrap_or_default();
        if call.ends_with(":countTokens") {
            return axum::Json(json!({"totalTokens": 5})).into_response();
        }
        if !call.ends_with(":streamGenerateContent") {
            return axum::Json(chunk(json!([{"text": "{}"}]))).into_response();
        }
        let names: Vec<String> = request["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| {
                t["functionDeclarations"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect();
        *s.functions.lock().unwrap() = names.clone();
        let newest = request["contents"]
            .as_array()
            .and_then(|c| c.iter().rev().find(|c| c["role"] == "user"))
            .cloned()
            .unwrap_or_default();
        let parts = newest["parts"].as_array().cloned().unwrap_or_default();
        let texts: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
        let last = texts.last().copied().unwrap_or_default().to_owned();
        s.turns.lock().unwrap().push(texts.join("\n"));
        if parts.iter().any(|p| p.get("functionResponse").is_some()) {
            stream(json!([{"text": "done"}]))
        } else if last.contains("please fail") {
            let error = json!({"error": {"code": 400, "message": "the stand-in refuses this prompt",
                "status": "INVALID_ARGUMENT"}});
            (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
        } else if last.contains("SEND-HELLO") {
            let send = names
                .iter()
                .find(|n| *n == "send" || n.ends_with("ac7__send") || n.ends_with("ac7_send"))
                .cloned()
                .unwrap_or_else(|| "send".into());
            stream(json!([{"functionCall": {"name": send,
                "args": {"to": "director", "body": "hello from the stand-in model"}}}]))
        } else {
            stream(json!([{"text": "noted"}]))
        }
    }
}

/// `ac7 acp -- claude-code-acp` as `builder` of `broker`, in `dir`'s own home and work folders.
fn session(broker: &TestBroker, dir: &Path, api: &str) -> Command {
    let [home, work] = ["home", "work"].map(|d| {
        let path = dir.join(d);
        std::fs::create_dir_all(&path).unwrap();
        path.canonicalize().unwrap()
    });
    let config = json!({
        "hasCompletedOnboarding": true,
        "customApiKeyResponses": {"approved": ["dummy"], "rejected": []},
        "projects": {work.to_str().unwrap(): {
            "hasTrustDialogAccepted": true,
            "hasCompletedProjectOnboarding": true,
        }},
    });
    std::fs::write(home.join(".claude.json"), config.to_string()).unwrap();
    let mut command = Command::new(common::ac7());
    command
        .args(["acp", "--url", &broker.url, "--no-trace", "--"])
        .args(recorded(&dir.join("to-agent.log")))
        .arg(claude_code_acp())
        .current_dir(&work)
        .env("HOME", &home)
        .env("AC7_TOKEN", broker.token("builder"))
        .env(
            "AC7_LOG",
            std::env::var("AC7_TEST_ACP_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env("ANTHROPIC_BASE_URL", api)
        .env("ANTHROPIC_API_KEY", "dummy")
        // claude refuses to skip permission prompts as root outside a sandbox.
        .env("IS_SANDBOX", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// The front of an agent command that records what the runner writes to the agent's stdin in
/// `log` on its way (`sh -c 'tee -a LOG | AGENT…'`).
fn recorded(log: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"tee -a "$0" | "$@""#.into(),
        log.to_str().unwrap().into(),
    ]
}

/// How many times `needle` is in the `session/prompt` requests the runner wrote to the agent.
fn prompts_with(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["method"] == "session/prompt")
        .map(|m| m["params"]["prompt"].to_string().matches(needle).count())
        .sum()
}

fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
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
    stderr
}

/// With claude-code-acp: a push becomes a turn whose model call of ac7's `send` reaches the
/// broker (the permission policy allows it); after a failed model call the next push is still a
/// turn; a burst of 40 pushes reaches the model once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_acp_takes_pushes_as_turns_and_survives_a_failed_model_call() {
    let broker = start_broker().await;
    let model = standin::StandIn::default();
    let api = model.start().await;
    let dir = common::tempdir();
    let to_agent = dir.path().join("to-agent.log");
    let mut child = session(&broker, dir.path(), &api).spawn().unwrap();
    let stderr = collect_stderr(&mut child);
    let context = || {
        // Each turn's start, and the burst markers in it.
        let turns: Vec<String> = model
            .turns()
            .iter()
            .map(|t| {
                let start: String = t.chars().take(120).collect();
                let bursts: Vec<&str> = t
                    .split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
                    .filter(|w| w.starts_with("burst-"))
                    .collect();
                format!("{start} … bursts {bursts:?}")
            })
            .collect();
        format!(
            "ac7 acp stderr:\n{}\nstand-in turns: {turns:#?}",
            stderr.lock().unwrap()
        )
    };
    let wait = Duration::from_secs(90);
    common::wait_until_showing("the session to start", wait, context, async || {
        stderr
            .lock()
            .unwrap()
            .contains("connected — Ctrl-C to stop")
    })
    .await;
    let dm = async |body: &str| {
        broker
            .push("director", json!({"to": "builder", "body": body}))
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    // A push is a turn; the model's send call lands in /history.
    dm("SEND-HELLO to director").await;
    common::wait_until_showing("the model's DM in /history", wait, context, async || {
        history(&broker)
            .await
            .iter()
            .any(|m| m["from"] == "builder" && m["body"] == "hello from the stand-in model")
    })
    .await;
    let first = model
        .turns()
        .into_iter()
        .find(|t| t.contains("SEND-HELLO"))
        .unwrap();
    assert!(
        first.contains("<channel ") && first.contains("from=\"director\""),
        "{first}"
    );

    // A failed model call (HTTP 400): claude-code-acp ends that turn as `end_turn` (the error is
    // only its message text), so there is no failed turn to tell director about; the next push is
    // still a turn.
    dm("please fail").await;
    common::wait_until_showing("the failing model call", wait, context, async || {
        model.turns().iter().any(|t| t.contains("please fail"))
    })
    .await;
    dm("after the failure").await;
    common::wait_until_showing("the push after the failure", wait, context, async || {
        model
            .turns()
            .iter()
            .any(|t| t.contains("after the failure"))
    })
    .await;

    // A burst of 40 pushes reaches the model, each once.
    for i in 0..40 {
        dm(&format!("burst-{i}-end")).await;
    }
    let at_model = |i: usize| {
        let needle = format!("burst-{i}-end");
        model.turns().iter().any(|t| t.contains(&needle))
    };
    common::wait_until_showing("all 40 pushes at the model", wait, context, async || {
        (0..40).all(at_model)
    })
    .await;
    // Each went to the agent in exactly one prompt.
    for i in 0..40 {
        assert_eq!(
            prompts_with(&to_agent, &format!("burst-{i}-end")),
            1,
            "burst-{i} prompted once\n{}",
            context()
        );
    }
    assert_eq!(sigterm(&mut child).await.code(), Some(143), "{}", context());
}

/// With Gemini CLI: a push becomes a turn whose model call of ac7's `send` reaches the broker
/// (the permission policy allows it); a failed model call is told to the sender, and the next
/// push is still a turn;
/// a burst of 40 pushes reaches the model once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_takes_pushes_as_turns_and_survives_a_failed_model_call() {
    let broker = start_broker().await;
    let model = gemini_standin::StandIn::default();
    let api = model.start().await;
    let dir = common::tempdir();
    let [home, work] = ["home", "work"].map(|d| {
        let path = dir.path().join(d);
        std::fs::create_dir_all(&path).unwrap();
        path.canonicalize().unwrap()
    });
    let to_agent = dir.path().join("to-agent.log");
    let mut child = Command::new(common::ac7())
        .args(["acp", "--url", &broker.url, "--no-trace", "--"])
        .args(recorded(&to_agent))
        .arg(gemini())
        .arg("--acp")
        .current_dir(&work)
        .env("HOME", &home)
        .env("AC7_TOKEN", broker.token("builder"))
        .env(
            "AC7_LOG",
            std::env::var("AC7_TEST_ACP_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env("GEMINI_API_KEY", "dummy")
        .env("GOOGLE_GEMINI_BASE_URL", &api)
        // Gemini CLI starts no MCP server (ours neither) in a folder it does not trust.
        .env("GEMINI_CLI_TRUST_WORKSPACE", "true")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stderr = collect_stderr(&mut child);
    let context = || {
        let turns: Vec<String> = model
            .turns()
            .iter()
            .map(|t| {
                t.chars()
                    .rev()
                    .take(300)
                    .collect::<String>()
                    .chars()
                    .rev()
                    .collect()
            })
            .collect();
        format!(
            "ac7 acp stderr:\n{}\nfunctions: {:?}\nstand-in turns: {turns:#?}",
            stderr.lock().unwrap(),
            model.functions.lock().unwrap()
        )
    };
    let wait = Duration::from_secs(90);
    common::wait_until_showing("the session to start", wait, context, async || {
        stderr
            .lock()
            .unwrap()
            .contains("connected — Ctrl-C to stop")
    })
    .await;
    let dm = async |body: &str| {
        broker
            .push("director", json!({"to": "builder", "body": body}))
            .await;
    };

    dm("SEND-HELLO to director").await;
    common::wait_until_showing("the model's DM in /history", wait, context, async || {
        history(&broker)
            .await
            .iter()
            .any(|m| m["from"] == "builder" && m["body"] == "hello from the stand-in model")
    })
    .await;

    // Gemini CLI answers the failed model call (HTTP 400) with an error: director is told.
    let failing = broker
        .push("director", json!({"to": "builder", "body": "please fail"}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    common::wait_until_showing("the turn-failed DM", wait, context, async || {
        history(&broker).await.iter().any(|m| {
            m["from"] == "builder"
                && m["title"] == "turn failed"
                && m["body"].as_str().unwrap().contains(&failing)
                && m["body"]
                    .as_str()
                    .unwrap()
                    .contains("the Gemini CLI turn carrying it failed")
        })
    })
    .await;
    dm("after the failure").await;
    common::wait_until_showing("the push after the failure", wait, context, async || {
        model
            .turns()
            .iter()
            .any(|t| t.contains("after the failure"))
    })
    .await;

    for i in 0..40 {
        dm(&format!("burst-{i}-end")).await;
    }
    let at_model = |i: usize| {
        let needle = format!("burst-{i}-end");
        model.turns().iter().any(|t| t.contains(&needle))
    };
    common::wait_until_showing("all 40 pushes at the model", wait, context, async || {
        (0..40).all(at_model)
    })
    .await;
    // Each went to the agent in exactly one prompt.
    for i in 0..40 {
        assert_eq!(
            prompts_with(&to_agent, &format!("burst-{i}-end")),
            1,
            "burst-{i} prompted once\n{}",
            context()
        );
    }
    assert_eq!(sigterm(&mut child).await.code(), Some(143), "{}", context());
}
