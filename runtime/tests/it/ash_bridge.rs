//! `ac7 ash-bridge` (the Ash dialect's bridge) with a scripted stand-in for `claude`
//! (`runtime/tests/python/fake_claude.py` on `CLAUDE_PATH`), driven by `AshClient` and by raw
//! sockets for what a well-behaved host never sends.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::dialect::ash::host::{Completion, ExecOutcome};
use ac7_protocol::dialect::ash::{Command, Query};
use ac7_runtime::dialects::ash_host::{AshClient, JobEvent};
use common::ash::spawn_ash_bridge;
use common::{tempdir, within};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

fn fake_claude() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/fake_claude.py")
}

struct AshBridge {
    child: tokio::process::Child,
    socket: PathBuf,
    workspace: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl AshBridge {
    /// Spawns `ac7 ash-bridge` and waits for its `R`.
    async fn start() -> Self {
        let dir = tempdir();
        let mut bridge = Self::start_in(dir.path(), &[]).await;
        bridge._dir = Some(dir);
        bridge
    }

    /// The same in `dir` (socket `dir/bridge.sock`, workspace `dir/ws`), with extra arguments.
    async fn start_in(dir: &Path, args: &[&str]) -> Self {
        let socket = dir.join("bridge.sock");
        let workspace = dir.join("ws");
        if !workspace.exists() {
            std::fs::create_dir(&workspace).unwrap();
        }
        let child = spawn_ash_bridge(|command| {
            command
                .args(args)
                .env("ASH_BRIDGE_SOCKET", &socket)
                .env("CLAUDE_PATH", fake_claude())
                .env("ASH_WORKSPACE_DIR", &workspace);
        })
        .await;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
        Self {
            child,
            socket,
            workspace,
            _dir: None,
        }
    }

    /// The claude session UUID the bridge keeps for host session `host`.
    fn agent_session(&self, host: &str) -> String {
        agent_session(&self.workspace, host)
    }

    async fn client(&self) -> AshClient {
        within(10, "ready", AshClient::connect(&self.socket))
            .await
            .unwrap()
    }

    async fn raw(&self) -> Raw {
        let stream = UnixStream::connect(&self.socket).await.unwrap();
        let (read, write) = stream.into_split();
        let mut raw = Raw {
            read: BufReader::new(read),
            write,
        };
        assert_eq!(raw.recv().await, json!({"ev": "ready"}));
        raw
    }

    /// Waits for the exit; returns the code, and whether every stdout byte was the one `R`.
    async fn exit(mut self) -> i32 {
        let status = within(10, "the bridge to exit", self.child.wait())
            .await
            .unwrap();
        let mut rest = Vec::new();
        let stdout = self.child.stdout.as_mut().unwrap();
        stdout.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "stdout carries only R: {rest:?}");
        assert!(!self.socket.exists(), "the socket was removed");
        status.code().unwrap_or(-1)
    }
}

struct Raw {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl Raw {
    async fn write(&mut self, bytes: &[u8]) {
        within(10, "writing to the bridge", self.write.write_all(bytes))
            .await
            .unwrap();
    }

    async fn send(&mut self, line: &str) {
        self.write(format!("{line}\n").as_bytes()).await;
    }

    async fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = within(10, "an event", self.read.read_line(&mut line))
            .await
            .unwrap();
        assert!(n > 0, "the bridge closed the connection");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// Events up to and including `done`.
    async fn turn(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        loop {
            let event = self.recv().await;
            let done = event["ev"] == "done";
            events.push(event);
            if done {
                return events;
            }
        }
    }

    async fn error(&mut self) -> String {
        let event = self.recv().await;
        assert_eq!(event["ev"], "error", "{event}");
        event["error"].as_str().unwrap().to_owned()
    }
}

fn assistant_text(messages: &[RawJson]) -> (Value, String) {
    let assistant: Value = messages
        .iter()
        .map(|m| m.parse::<Value>().unwrap())
        .find(|m| m["type"] == "assistant")
        .expect("an assistant message");
    let text = assistant["message"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    (assistant, text)
}

/// The stand-in agent (message `agent`, echoing its argv) was told to resume `uuid`.
fn assert_resumes(agent: &Value, uuid: &str) {
    assert_eq!(
        agent["argv"].as_array().unwrap()[8..10],
        [json!("--resume"), json!(uuid)],
        "{agent}"
    );
}

fn done(session: &str) -> Completion {
    Completion {
        session_id: session.into(),
        error: None,
        exec: None,
    }
}

#[tokio::test]
async fn query_resume_exec_and_shutdown() {
    let bridge = AshBridge::start().await;
    let client = bridge.client().await;

    let (messages, completion) = client.query("hello", "s1", false).finish().await;
    assert_eq!(completion, Ok(done("s1")));
    let kinds: Vec<String> = messages
        .iter()
        .map(|m| {
            m.parse::<Value>().unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["system", "assistant", "result"]);
    let (assistant, text) = assistant_text(&messages);
    assert_eq!(text, "echo: hello");
    let argv = &assistant["argv"];
    // The host's session id is not claude's: s1 maps to a fresh UUID, kept in the workspace.
    let s1 = bridge.agent_session("s1");
    assert!(uuid::Uuid::parse_str(&s1).is_ok(), "{s1}");
    // Nobody can answer a permission prompt headless: Ash's bypassPermissions, which claude
    // refuses as root, where the default is acceptEdits.
    let mode = if rustix::process::geteuid().is_root() {
        "acceptEdits"
    } else {
        "bypassPermissions"
    };
    assert_eq!(
        argv,
        &json!([
            "-p",
            "--output-format",
            "stream-json",
            "--input-format",
            "stream-json",
            "--verbose",
            "--permission-mode",
            mode,
            "--session-id",
            s1
        ])
    );
    let map = bridge.workspace.join(".ac7-ash-sessions.json");
    let file_mode = std::fs::metadata(&map).unwrap().permissions().mode();
    assert_eq!(file_mode & 0o777, 0o600, "session map mode {file_mode:o}");
    assert_eq!(
        Path::new(assistant["cwd"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        bridge.workspace.canonicalize().unwrap()
    );
    // The agent's messages pass through byte for byte (here: its spacing, raw UTF-8).
    let (messages, _) = client.query("unicode", "s1", false).finish().await;
    assert!(
        messages[1].get().starts_with(r#"{"type": "assistant", "message": {"content": [{"type": "text", "text": "héllo 世界 🎉"#),
        "{}",
        messages[1].get()
    );
    // A session that finished a turn is continued with --resume.
    let (messages, completion) = client.query("again", "s1", false).finish().await;
    assert_eq!(completion, Ok(done("s1")));
    let (assistant, _) = assistant_text(&messages);
    assert_resumes(&assistant, &s1);

    // resume without a prompt: done for a session the bridge has; the next query
    // continues it.
    let resume = |session: &str| {
        client.submit(Command::Resume {
            session_id: session.into(),
            turn: None,
        })
    };
    let (messages, completion) = resume("s1").finish().await;
    assert_eq!((messages.len(), completion), (0, Ok(done("s1"))));
    // A claude session made elsewhere, named by its UUID, is adopted.
    let elsewhere = "0b4f6d5e-7c0a-4f3e-9d1b-2a6c8e0f1a2b";
    std::fs::create_dir_all(bridge.workspace.join(".fake-claude")).unwrap();
    std::fs::write(bridge.workspace.join(".fake-claude").join(elsewhere), b"").unwrap();
    let (_, completion) = resume(elsewhere).finish().await;
    assert_eq!(completion, Ok(done(elsewhere)));
    let (messages, completion) = client.query("more", elsewhere, false).finish().await;
    assert_eq!(completion, Ok(done(elsewhere)));
    let (assistant, _) = assistant_text(&messages);
    assert_resumes(&assistant, elsewhere);
    // A session it has never seen cannot be resumed: error, then done.
    let (_, completion) = resume("s2").finish().await;
    let completion = completion.unwrap();
    assert_eq!(completion.session_id, "s2");
    assert_eq!(
        completion.error.as_deref(),
        Some(
            "cannot resume session \"s2\": this bridge has no conversation for it (send a query \
             to start one, or resume a claude session by its UUID)"
        )
    );
    // With a prompt (our extension) the turn runs on the resumed session at once.
    let (messages, completion) = client
        .submit(Command::Resume {
            session_id: "s1".into(),
            turn: Some(Query {
                prompt: RawJson::from_value("go on").unwrap(),
                session_id: "s1".into(),
                include_partial_messages: false,
                options: Default::default(),
            }),
        })
        .finish()
        .await;
    assert_eq!(completion, Ok(done("s1")));
    let (assistant, text) = assistant_text(&messages);
    assert_eq!(text, "echo: go on");
    assert_resumes(&assistant, &s1);

    // Partial messages come first; a query's options become flags.
    let mut options = std::collections::BTreeMap::new();
    for (key, value) in [
        ("model", json!("sonnet")),
        ("maxTurns", json!(3)),
        ("allowedTools", json!(["Read", "Bash(ls:*)"])),
        ("effort", json!("high")),
    ] {
        options.insert(key.to_owned(), RawJson::from_value(&value).unwrap());
    }
    let query = Command::Query(Query {
        prompt: RawJson::from_value("partial").unwrap(),
        session_id: "s2".into(),
        include_partial_messages: true,
        options,
    });
    let (messages, completion) = client.submit(query).finish().await;
    assert_eq!(completion, Ok(done("s2")));
    let first: Value = messages[1].parse().unwrap();
    assert_eq!(first["type"], "stream_event");
    let (assistant, _) = assistant_text(&messages);
    let s2 = bridge.agent_session("s2");
    assert_ne!(s1, s2);
    assert_eq!(
        assistant["argv"].as_array().unwrap()[8..],
        [
            "--session-id",
            &s2,
            "--include-partial-messages",
            "--model",
            "sonnet",
            "--max-turns",
            "3",
            "--allowedTools",
            "Read,Bash(ls:*)"
        ]
        .map(|a| json!(a))
    );

    // exec: exec_result then done "".
    let (messages, completion) = client
        .exec("echo out; echo err >&2; pwd; exit 7")
        .finish()
        .await;
    let completion = completion.unwrap();
    assert!(messages.is_empty());
    assert_eq!(completion.session_id, "");
    let exec = completion.exec.unwrap();
    assert_eq!((exec.exit_code, exec.stderr.as_str()), (7, "err\n"));
    let pwd = exec.stdout.strip_prefix("out\n").unwrap().trim_end();
    assert_eq!(
        Path::new(pwd).canonicalize().unwrap(),
        bridge.workspace.canonicalize().unwrap()
    );
    let (_, completion) = client
        .submit(Command::Exec {
            command: "sleep 10".into(),
            timeout_ms: 200,
        })
        .finish()
        .await;
    let ExecOutcome {
        exit_code, stderr, ..
    } = completion.unwrap().exec.unwrap();
    assert_eq!(exit_code, -1);
    assert!(stderr.contains("timed out after 200 ms"), "{stderr}");

    // shutdown: the bridge exits 0 and removes its socket, even with a query running.
    let mut other = bridge.raw().await;
    other
        .send(r#"{"cmd":"query","prompt":"slow","sessionId":"s3"}"#)
        .await;
    assert_eq!(other.recv().await["data"]["type"], "system");
    assert_eq!(
        other.recv().await["data"]["message"]["content"][0]["text"],
        "working"
    );
    let s3 = bridge.agent_session("s3");
    let pid = std::fs::read_to_string(bridge.workspace.join(format!("{s3}.pid"))).unwrap();
    client.shutdown();
    assert_eq!(bridge.exit().await, 0);
    process_gone(&pid).await;
}

#[tokio::test]
async fn a_failing_agent_is_error_then_done() {
    let bridge = AshBridge::start().await;
    let client = bridge.client().await;
    let (messages, completion) = client.query("fail", "s1", false).finish().await;
    assert_eq!(messages.len(), 1, "only the init message");
    let completion = completion.unwrap();
    assert_eq!(completion.session_id, "s1");
    let error = completion.error.unwrap();
    assert!(
        error.contains("exit status: 3") && error.contains("boom: the model is unavailable"),
        "{error}"
    );
    // The connection goes on.
    let (_, completion) = client.query("hello", "s1", false).finish().await;
    assert_eq!(completion, Ok(done("s1")));

    // A missing agent binary is a failed turn too.
    drop(client);
    let dir = tempdir();
    let socket = dir.path().join("b.sock");
    let _child = spawn_ash_bridge(|command| {
        command
            .env("ASH_BRIDGE_SOCKET", &socket)
            .env("CLAUDE_PATH", dir.path().join("no-such-claude"))
            .env_remove("ASH_WORKSPACE_DIR")
            // Without a workspace the session map is kept in the bridge's working directory.
            .current_dir(dir.path());
    })
    .await;
    let client = within(10, "ready", AshClient::connect(&socket))
        .await
        .unwrap();
    let (_, completion) = client.query("hello", "s1", false).finish().await;
    let error = completion.unwrap().error.unwrap();
    assert!(error.starts_with("cannot start the agent"), "{error}");
}

#[tokio::test]
async fn interrupt_ends_the_turn_with_done_only_and_spares_other_connections() {
    let bridge = AshBridge::start().await;
    let mut a = bridge.raw().await;
    let mut b = bridge.raw().await;
    // Idle interrupt: nothing happens.
    a.send(r#"{"cmd":"interrupt"}"#).await;
    a.send(r#"{"cmd":"query","prompt":"slow","sessionId":"sa"}"#)
        .await;
    b.send(r#"{"cmd":"query","prompt":"pause","sessionId":"sb"}"#)
        .await;
    for conn in [&mut a, &mut b] {
        assert_eq!(conn.recv().await["data"]["type"], "system");
        assert_eq!(
            conn.recv().await["data"]["message"]["content"][0]["text"],
            "working"
        );
    }
    // One turn at a time per connection: a query sent while one runs, and one sent right after
    // the interrupt (before the agent has exited), wait their turn and then run, in order.
    a.send(r#"{"cmd":"query","prompt":"first","sessionId":"sa"}"#)
        .await;
    a.send(r#"{"cmd":"interrupt"}"#).await;
    a.send(r#"{"cmd":"query","prompt":"second","sessionId":"sa"}"#)
        .await;
    assert_eq!(a.recv().await, json!({"ev": "done", "sessionId": "sa"}));
    // b's agent was not touched: it finishes normally.
    let events = b.turn().await;
    let kinds: Vec<&Value> = events.iter().map(|e| &e["ev"]).collect();
    assert_eq!(kinds, ["message", "message", "done"], "{events:?}");
    assert_eq!(events[1]["data"]["type"], "result");
    assert_eq!(events[2], json!({"ev": "done", "sessionId": "sb"}));
    let sa = bridge.agent_session("sa");
    for prompt in ["first", "second"] {
        let events = a.turn().await;
        assert_eq!(events.len(), 4, "{events:?}");
        assert_eq!(
            events[1]["data"]["message"]["content"][0]["text"],
            format!("echo: {prompt}")
        );
        assert_resumes(&events[1]["data"], &sa);
        assert_eq!(events[3], json!({"ev": "done", "sessionId": "sa"}));
    }
}

/// The Ash dialect: every command ends with `done`, so a host pairing each `error` with the next
/// `done` (ours does) stays in step even when it sends commands without waiting.
#[tokio::test]
async fn commands_sent_without_waiting_each_get_their_own_done() {
    let bridge = AshBridge::start().await;
    let mut raw = bridge.raw().await;
    let mut batch = String::new();
    for (i, prompt) in ["pause", "fail", "hello"].iter().enumerate() {
        batch.push_str(&format!(
            "{{\"cmd\":\"query\",\"prompt\":\"{prompt}\",\"sessionId\":\"q{i}\"}}\n"
        ));
    }
    batch.push_str("{\"cmd\":\"exec\",\"command\":\"echo x\"}\n");
    raw.write(batch.as_bytes()).await;
    let ends: Vec<Vec<Value>> = vec![
        raw.turn().await,
        raw.turn().await,
        raw.turn().await,
        raw.turn().await,
    ];
    let tails: Vec<Vec<&str>> = ends
        .iter()
        .map(|t| {
            t.iter()
                .map(|e| e["ev"].as_str().unwrap())
                .filter(|e| *e != "message")
                .collect()
        })
        .collect();
    assert_eq!(
        tails,
        [
            vec!["done"],
            vec!["error", "done"],
            vec!["done"],
            vec!["exec_result", "done"]
        ]
    );
    let sessions: Vec<&Value> = ends
        .iter()
        .map(|t| &t.last().unwrap()["sessionId"])
        .collect();
    assert_eq!(sessions, ["q0", "q1", "q2", ""]);
    // The same through AshClient, many at once.
    let client = bridge.client().await;
    let jobs: Vec<_> = (0..5)
        .map(|i| client.query(&format!("n{i}"), &format!("c{i}"), false))
        .collect();
    for (i, job) in jobs.into_iter().enumerate() {
        let (messages, completion) = job.finish().await;
        assert_eq!(completion, Ok(done(&format!("c{i}"))));
        assert_eq!(assistant_text(&messages).1, format!("echo: n{i}"));
    }
}

/// The Ash dialect: a failure is `error` then `done` — also when claude printed a result before
/// exiting non-zero (it does on API errors).
#[tokio::test]
async fn a_failed_turn_that_printed_a_result_is_error_then_done() {
    let bridge = AshBridge::start().await;
    let mut raw = bridge.raw().await;
    raw.send(r#"{"cmd":"query","prompt":"fail_after_result","sessionId":"f"}"#)
        .await;
    let events = raw.turn().await;
    let kinds: Vec<&str> = events.iter().map(|e| e["ev"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["message", "message", "error", "done"], "{events:?}");
    assert_eq!(events[1]["data"]["type"], "result");
    assert_eq!(
        events[2]["error"],
        "the agent exited with exit status: 1: API Error: 529 overloaded"
    );
    assert_eq!(events[3], json!({"ev": "done", "sessionId": "f"}));
}

/// The Ash dialect: `done` names the session the command named, even when the agent's result names
/// another.
#[tokio::test]
async fn done_carries_the_session_the_command_named() {
    let bridge = AshBridge::start().await;
    let client = bridge.client().await;
    let (messages, completion) = client.query("rename", "mine", false).finish().await;
    let result: Value = messages.last().unwrap().parse().unwrap();
    assert_eq!(result["session_id"], "a-session-of-its-own");
    assert_eq!(completion, Ok(done("mine")));
}

/// The host's session ids are not claude's: any string works, and a restarted bridge with the
/// same workspace continues the conversation (`--resume`) instead of failing with "already in
/// use".
#[tokio::test]
async fn host_session_ids_survive_a_bridge_restart() {
    let dir = tempdir();
    let bridge = AshBridge::start_in(dir.path(), &["--permission-mode", "plan"]).await;
    let client = bridge.client().await;
    let (messages, completion) = client.query("hello", "chat #1 é", false).finish().await;
    assert_eq!(completion, Ok(done("chat #1 é")));
    let (assistant, _) = assistant_text(&messages);
    let uuid = bridge.agent_session("chat #1 é");
    assert_eq!(
        assistant["argv"].as_array().unwrap()[6..10],
        [
            json!("--permission-mode"),
            json!("plan"),
            json!("--session-id"),
            json!(uuid)
        ]
    );
    client.shutdown();
    assert_eq!(bridge.exit().await, 0);

    let bridge = AshBridge::start_in(dir.path(), &[]).await;
    let client = bridge.client().await;
    let (messages, completion) = client.query("again", "chat #1 é", false).finish().await;
    assert_eq!(completion, Ok(done("chat #1 é")));
    let (assistant, text) = assistant_text(&messages);
    assert_eq!(text, "echo: again");
    assert_resumes(&assistant, &uuid);
    // A first turn that failed after claude had created the session: the next one resumes it
    // rather than failing with "already in use".
    let (_, completion) = client.query("fail", "fresh", false).finish().await;
    assert!(completion.unwrap().error.is_some());
    let (messages, completion) = client.query("hello", "fresh", false).finish().await;
    assert_eq!(completion, Ok(done("fresh")));
    assert_eq!(assistant_text(&messages).0["argv"][8], "--resume");
    client.shutdown();
    assert_eq!(bridge.exit().await, 0);
}

#[tokio::test]
async fn malformed_input_is_an_error_event_and_the_connection_stays() {
    let bridge = AshBridge::start().await;
    let mut raw = bridge.raw().await;
    for (line, want) in [
        ("garbage", "invalid command: not valid JSON"),
        ("[1,2]", "invalid command: not a JSON object"),
        ("\"query\"", "invalid command: not a JSON object"),
        (
            r#"{"cmd":"query","prompt":"x","sessionId":"s","__proto__":{"polluted":true}}"#,
            "invalid command: forbidden key \"__proto__\"",
        ),
        (
            r#"{"cmd":"exec","command":"id","constructor":1}"#,
            "invalid command: forbidden key \"constructor\"",
        ),
        (
            r#"{"ev":"ready"}"#,
            "invalid command: has \"ev\" where \"cmd\" is expected",
        ),
        (
            r#"{"cmd":"launch"}"#,
            "invalid command: unknown command \"launch\"",
        ),
        (
            r#"{"cmd":"query","prompt":"x"}"#,
            "invalid command: \"sessionId\" must be a string",
        ),
    ] {
        raw.send(line).await;
        let error = raw.error().await;
        assert!(error.starts_with(want), "{line}: {error}");
    }
    // Invalid UTF-8.
    raw.write(b"{\"cmd\":\"\xff\"}\n").await;
    assert_eq!(raw.error().await, "invalid command: not valid UTF-8");
    // An oversized line is dropped (and reported) without being buffered whole.
    let mut big = vec![b'x'; 16 * 1024 * 1024 + 1];
    big.push(b'\n');
    raw.write(&big).await;
    let error = raw.error().await;
    assert!(error.contains("exceeds the 16777216-byte limit"), "{error}");
    // A UTF-8 character split across two reads decodes intact.
    let line = r#"{"cmd":"query","prompt":"é世","sessionId":"s1"}"#
        .as_bytes()
        .to_vec();
    let cut = line.iter().position(|b| *b == 0xe4).unwrap() + 1;
    raw.write(&line[..cut]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    raw.write(&line[cut..]).await;
    raw.write(b"\n").await;
    let events = raw.turn().await;
    assert_eq!(
        events[1]["data"]["message"]["content"][0]["text"],
        "echo: é世"
    );
    assert_eq!(
        events.last().unwrap(),
        &json!({"ev": "done", "sessionId": "s1"})
    );
}

#[tokio::test]
async fn a_missing_socket_variable_is_exit_1() {
    let out = within(
        10,
        "ac7 ash-bridge",
        tokio::process::Command::new(common::ac7())
            .arg("ash-bridge")
            .env_remove("ASH_BRIDGE_SOCKET")
            .output(),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "ac7 ash-bridge: ASH_BRIDGE_SOCKET is not set (or empty): set it to the socket path the Ash host will connect to\n"
    );
}

#[tokio::test]
async fn sigterm_stops_the_bridge_and_removes_the_socket() {
    let bridge = AshBridge::start().await;
    let client = bridge.client().await;
    let mut job = client.query("slow", "s1", false);
    assert!(matches!(job.next().await, Some(JobEvent::Message(_))));
    let pid = bridge.child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(bridge.exit().await, 0);
}

/// Waits (bounded) until the stand-in agent of host session `session` has exited.
async fn agent_stopped(bridge: &AshBridge, session: &str) {
    let uuid = bridge.agent_session(session);
    let pid = std::fs::read_to_string(bridge.workspace.join(format!("{uuid}.pid"))).unwrap();
    process_gone(&pid).await;
}

/// The claude session UUID kept for host session `host` in `workspace`'s session map.
fn agent_session(workspace: &Path, host: &str) -> String {
    let map: Value =
        serde_json::from_slice(&std::fs::read(workspace.join(".ac7-ash-sessions.json")).unwrap())
            .unwrap();
    map["sessions"][host]["agentSession"]
        .as_str()
        .unwrap_or_else(|| panic!("no session {host} in {map}"))
        .to_owned()
}

/// Waits (bounded) until process `pid` no longer exists.
async fn process_gone(pid: &str) {
    let proc = PathBuf::from(format!("/proc/{}", pid.trim()));
    // A reaped child disappears from /proc; the bridge reaps its children.
    common::wait_until(
        "the agent to be stopped",
        Duration::from_secs(10),
        async || !proc.exists(),
    )
    .await;
}

#[tokio::test]
async fn an_agent_ignoring_sigint_is_killed_after_the_grace_period() {
    // The grace is 2 s; this bridge uses 300 ms so the test need not wait 2 s.
    let dir = tempdir();
    let bridge = AshBridge::start_in(dir.path(), &["--interrupt-grace-ms", "300"]).await;
    let mut raw = bridge.raw().await;
    raw.send(r#"{"cmd":"query","prompt":"stubborn","sessionId":"s1"}"#)
        .await;
    assert_eq!(raw.recv().await["data"]["type"], "system");
    assert_eq!(
        raw.recv().await["data"]["message"]["content"][0]["text"],
        "working"
    );
    let t = std::time::Instant::now();
    raw.send(r#"{"cmd":"interrupt"}"#).await;
    assert_eq!(raw.recv().await, json!({"ev": "done", "sessionId": "s1"}));
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "SIGKILL came after {waited:?}"
    );
    agent_stopped(&bridge, "s1").await;
}

#[tokio::test]
async fn a_host_that_disconnects_mid_query_stops_its_agent() {
    let bridge = AshBridge::start().await;
    let mut raw = bridge.raw().await;
    raw.send(r#"{"cmd":"query","prompt":"slow","sessionId":"gone"}"#)
        .await;
    assert_eq!(raw.recv().await["data"]["type"], "system");
    assert_eq!(
        raw.recv().await["data"]["message"]["content"][0]["text"],
        "working"
    );
    drop(raw);
    agent_stopped(&bridge, "gone").await;
    // The bridge serves the next host.
    let client = bridge.client().await;
    let (_, completion) = client.query("hello", "s2", false).finish().await;
    assert_eq!(completion, Ok(done("s2")));
}

#[tokio::test]
async fn the_client_reports_a_bridge_that_closes_before_ready() {
    let dir = tempdir();
    let path = dir.path().join("mute.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let server = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        drop(conn);
    });
    let err = within(10, "connect", AshClient::connect(&path))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "the bridge connection closed");
    server.await.unwrap();
    let err = AshClient::connect(dir.path().join("none.sock"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot connect to the Ash bridge at "),
        "{err}"
    );
}
