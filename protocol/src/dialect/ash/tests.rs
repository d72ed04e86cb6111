use std::time::{Duration, Instant};

use super::bridge::{
    Answer, AshBridgeOutput, AshConnection, MAX_QUEUED_BYTES, MAX_QUEUED_COMMANDS,
};
use super::host::{AshHost, Completion, ExecOutcome, HostError, HostOutput, READY_TIMEOUT};
use super::*;
use crate::test_support::snapshots;

fn raw(text: &str) -> RawJson {
    RawJson::from_text(text).unwrap()
}

#[test]
fn commands_and_events_round_trip_and_validate() {
    let query = br#"{"cmd":"query","prompt":"hi","sessionId":"s1","includePartialMessages":true,"model":"sonnet","maxTurns":3}"#;
    let Command::Query(q) = decode_command(query).unwrap() else {
        panic!()
    };
    assert_eq!(q.prompt, raw(r#""hi""#));
    assert!(q.include_partial_messages);
    assert_eq!(q.options.keys().collect::<Vec<_>>(), ["maxTurns", "model"]);
    let line = command_line(&Command::Query(q.clone()));
    assert_eq!(
        decode_command(&line[..line.len() - 1]),
        Ok(Command::Query(q))
    );
    let blocks = br#"{"cmd":"query","prompt":[{"type":"text","text":"hi"}],"sessionId":"s"}"#;
    assert!(decode_command(blocks).is_ok());
    assert_eq!(
        decode_command(br#"{"cmd":"exec","command":"ls"}"#),
        Ok(Command::Exec {
            command: "ls".into(),
            timeout_ms: DEFAULT_EXEC_TIMEOUT_MS
        })
    );
    assert_eq!(
        decode_command(br#"{"cmd":"interrupt","extra":1}"#),
        Ok(Command::Interrupt)
    );

    let invalid = |line: &[u8]| decode_command(line).unwrap_err().0;
    assert_eq!(
        invalid(b"nope"),
        "not valid JSON: expected ident at line 1 column 2"
    );
    assert_eq!(invalid(b"[1]"), "not a JSON object");
    assert_eq!(
        invalid(br#"{"cmd":"query","sessionId":"s"}"#),
        "\"prompt\" must be a string or content blocks"
    );
    assert_eq!(
        invalid(br#"{"cmd":"query","prompt":"p"}"#),
        "\"sessionId\" must be a string"
    );
    assert_eq!(
        invalid(br#"{"cmd":"resume"}"#),
        "\"sessionId\" must be a string"
    );
    assert_eq!(
        invalid(br#"{"cmd":"exec"}"#),
        "\"command\" must be a string"
    );
    assert_eq!(invalid(br#"{"cmd":"fly"}"#), "unknown command \"fly\"");
    assert_eq!(
        invalid(br#"{"cmd":"shutdown","ev":"done"}"#),
        "has both \"cmd\" and \"ev\""
    );
    assert_eq!(
        invalid(br#"{"cmd":"shutdown","__proto__":{}}"#),
        "forbidden key \"__proto__\""
    );
    assert_eq!(
        invalid(br#"{"ev":"ready"}"#),
        "has \"ev\" where \"cmd\" is expected"
    );
    assert_eq!(invalid(br#"{"cmd":7}"#), "\"cmd\" must be a string");

    for event in [
        Event::Ready,
        Event::Message {
            data: raw(r#"{"type":"assistant","message":{"content":[]}}"#),
        },
        Event::Error {
            error: "boom".into(),
        },
        Event::Done {
            session_id: "s1".into(),
        },
        Event::ExecResult {
            exit_code: 2,
            stdout: "a\n".into(),
            stderr: "".into(),
        },
    ] {
        let line = event_line(&event);
        assert_eq!(decode_event(&line[..line.len() - 1]), Ok(event));
    }
    assert!(decode_event(br#"{"ev":"message"}"#).is_err());
    assert!(decode_event(br#"{"ev":"done","sessionId":1}"#).is_err());
}

fn drain(c: &mut AshConnection, t: &mut String) -> Vec<AshBridgeOutput> {
    let out: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
    for o in &out {
        t.push_str(&match o {
            AshBridgeOutput::Transmit(line) => {
                format!("  send < {}", String::from_utf8_lossy(line))
            }
            other => format!("  {other:?}\n"),
        });
    }
    out
}

fn sent(out: &[AshBridgeOutput]) -> Vec<Event> {
    out.iter()
        .filter_map(|o| match o {
            AshBridgeOutput::Transmit(line) => Some(decode_event(&line[..line.len() - 1]).unwrap()),
            _ => None,
        })
        .collect()
}

#[test]
fn bridge_connection_transcript() {
    let mut c = AshConnection::new();
    let mut t = String::new();
    let host = |c: &mut AshConnection, t: &mut String, line: &str| {
        t.push_str(&format!("host > {line}\n"));
        c.handle_bytes(format!("{line}\n").as_bytes());
        drain(c, t)
    };
    t.push_str("(connected)\n");
    assert_eq!(sent(&drain(&mut c, &mut t)), vec![Event::Ready]);

    let out = host(
        &mut c,
        &mut t,
        r#"{"cmd":"query","prompt":"hi","sessionId":"s1"}"#,
    );
    assert!(matches!(&out[0], AshBridgeOutput::StartQuery(q) if q.session_id == "s1"));
    let out = host(
        &mut c,
        &mut t,
        r#"{"cmd":"query","prompt":"again","sessionId":"s2"}"#,
    );
    assert!(out.is_empty(), "queued behind the running query");
    assert_eq!(c.queued(), 1);
    t.push_str("(agent prints two messages and ends, naming its own session)\n");
    c.notify(raw(r#"{"type":"assistant"}"#));
    c.notify(raw(r#"{"type":"result","session_id":"0b5e…"}"#));
    c.respond(Answer::Query(Ok(())));
    let out = drain(&mut c, &mut t);
    assert_eq!(
        sent(&out),
        vec![
            Event::Message {
                data: raw(r#"{"type":"assistant"}"#)
            },
            Event::Message {
                data: raw(r#"{"type":"result","session_id":"0b5e…"}"#)
            },
            Event::Done {
                session_id: "s1".into()
            },
        ],
        "done names the session the command named"
    );
    assert!(
        matches!(out.last(), Some(AshBridgeOutput::StartQuery(q)) if q.session_id == "s2"),
        "the queued query starts after done"
    );
    c.respond(Answer::Query(Ok(())));
    assert_eq!(
        sent(&drain(&mut c, &mut t)),
        vec![Event::Done {
            session_id: "s2".into()
        }]
    );

    host(
        &mut c,
        &mut t,
        r#"{"cmd":"query","prompt":"fail","sessionId":"s1"}"#,
    );
    t.push_str("(agent fails)\n");
    c.respond(Answer::Query(Err("claude exited with status 1".into())));
    let out = drain(&mut c, &mut t);
    assert_eq!(
        sent(&out),
        vec![
            Event::Error {
                error: "claude exited with status 1".into()
            },
            Event::Done {
                session_id: "s1".into()
            }
        ]
    );

    host(
        &mut c,
        &mut t,
        r#"{"cmd":"query","prompt":"long","sessionId":"s1"}"#,
    );
    let out = host(&mut c, &mut t, r#"{"cmd":"interrupt"}"#);
    assert_eq!(out, vec![AshBridgeOutput::StopAgent]);
    t.push_str("(agent prints after the interrupt, then dies of the signal)\n");
    c.notify(raw("{}"));
    c.respond(Answer::Query(Err("killed by SIGINT".into())));
    let out = drain(&mut c, &mut t);
    assert_eq!(
        sent(&out),
        vec![Event::Done {
            session_id: "s1".into()
        }],
        "interrupt: done, no error"
    );
    let out = host(&mut c, &mut t, r#"{"cmd":"interrupt"}"#);
    assert!(out.is_empty(), "interrupt while idle does nothing");

    let out = host(
        &mut c,
        &mut t,
        r#"{"cmd":"exec","command":"echo hi","timeout":500}"#,
    );
    assert_eq!(
        out,
        vec![AshBridgeOutput::StartExec {
            command: "echo hi".into(),
            timeout_ms: 500
        }]
    );
    c.respond(Answer::Exec {
        exit_code: 0,
        stdout: "hi\n".into(),
        stderr: String::new(),
    });
    let out = drain(&mut c, &mut t);
    assert_eq!(
        sent(&out)[1],
        Event::Done {
            session_id: String::new()
        }
    );

    let out = host(&mut c, &mut t, r#"{"cmd":"resume","sessionId":"s9"}"#);
    assert_eq!(
        out,
        vec![AshBridgeOutput::ResumeSession {
            session_id: "s9".into()
        }]
    );
    c.respond(Answer::Resume(Ok(())));
    assert_eq!(
        sent(&drain(&mut c, &mut t)),
        vec![Event::Done {
            session_id: "s9".into()
        }]
    );
    host(&mut c, &mut t, "{broken");
    host(
        &mut c,
        &mut t,
        r#"{"cmd":"query","prompt":"x","sessionId":"s","constructor":1}"#,
    );
    let out = host(&mut c, &mut t, r#"{"cmd":"shutdown"}"#);
    assert_eq!(out, vec![AshBridgeOutput::Shutdown]);
    snapshots(|| insta::assert_snapshot!("ash_bridge_connection_transcript", t));
}

#[test]
fn state_is_per_connection() {
    let mut a = AshConnection::new();
    let mut b = AshConnection::new();
    let mut t = String::new();
    a.handle_bytes(b"{\"cmd\":\"query\",\"prompt\":\"a\",\"sessionId\":\"sa\"}\n");
    b.handle_bytes(b"{\"cmd\":\"query\",\"prompt\":\"b\",\"sessionId\":\"sb\"}\n");
    drain(&mut a, &mut t);
    drain(&mut b, &mut t);
    b.handle_bytes(b"{\"cmd\":\"interrupt\"}\n");
    assert_eq!(drain(&mut b, &mut t), vec![AshBridgeOutput::StopAgent]);
    assert!(
        drain(&mut a, &mut t).is_empty(),
        "an interrupt on one connection never touches another"
    );
    a.notify(raw("{}"));
    assert_eq!(sent(&drain(&mut a, &mut t)).len(), 1);
}

#[test]
fn utf8_split_across_reads_and_oversized_lines() {
    let mut c = AshConnection::new();
    let mut t = String::new();
    drain(&mut c, &mut t);
    let line = "{\"cmd\":\"query\",\"prompt\":\"héllo → 😀\",\"sessionId\":\"s\"}\n".as_bytes();
    for b in line {
        c.handle_bytes(std::slice::from_ref(b));
    }
    let out = drain(&mut c, &mut t);
    let AshBridgeOutput::StartQuery(q) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(q.prompt, raw("\"héllo → 😀\""));

    let mut c = AshConnection::with_max_line(64);
    drain(&mut c, &mut t);
    for _ in 0..1000 {
        c.handle_bytes(&[b'x'; 100]);
    }
    c.handle_bytes(b"\n{\"cmd\":\"interrupt\"}\n");
    let out = drain(&mut c, &mut t);
    assert_eq!(
        sent(&out),
        vec![Event::Error {
            error: "command of 100001 bytes exceeds the 64-byte limit".into()
        }],
        "dropped with one error; the next command is read normally"
    );
}

#[test]
fn host_waits_for_ready_runs_in_order_and_keeps_errors_with_their_done() {
    let start = Instant::now();
    let mut h = AshHost::new(start);
    let q = |p: &str| {
        Command::Query(Query {
            prompt: raw(&format!("\"{p}\"")),
            session_id: "s".into(),
            include_partial_messages: false,
            options: Default::default(),
        })
    };
    h.request(q("one"), 1, Instant::now());
    h.request(
        Command::Exec {
            command: "true".into(),
            timeout_ms: 100,
        },
        2,
        Instant::now(),
    );
    assert_eq!(h.poll_output(), None, "nothing is sent before ready");
    h.handle_bytes(b"{\"ev\":\"ready\"}\n", start);
    assert_eq!(h.poll_output(), Some(HostOutput::Ready));
    assert_eq!(
        h.poll_output(),
        Some(HostOutput::Transmit(command_line(&q("one"))))
    );
    assert_eq!(h.poll_output(), None, "one command at a time");
    h.handle_bytes(b"{\"ev\":\"message\",\"data\":{\"n\":1}}\n{\"ev\":\"error\",\"error\":\"bad\"}\n{\"ev\":\"done\",\"sessionId\":\"s\"}\n", start);
    assert_eq!(
        h.poll_output(),
        Some(HostOutput::Message {
            token: 1,
            data: raw("{\"n\":1}")
        })
    );
    assert_eq!(
        h.poll_output(),
        Some(HostOutput::Completed {
            token: 1,
            result: Ok(Completion {
                session_id: "s".into(),
                error: Some("bad".into()),
                exec: None
            })
        })
    );
    assert!(
        matches!(h.poll_output(), Some(HostOutput::Transmit(_))),
        "the exec goes out after done"
    );
    h.handle_bytes(b"{\"ev\":\"exec_result\",\"exitCode\":0,\"stdout\":\"\",\"stderr\":\"\"}\n{\"ev\":\"done\",\"sessionId\":\"\"}\n", start);
    assert_eq!(
        h.poll_output(),
        Some(HostOutput::Completed {
            token: 2,
            result: Ok(Completion {
                session_id: String::new(),
                error: None,
                exec: Some(ExecOutcome {
                    exit_code: 0,
                    stdout: String::new(),
                    stderr: String::new()
                })
            })
        })
    );
    h.request(q("two"), 3, Instant::now());
    h.poll_output();
    h.handle_closed(start);
    assert_eq!(
        h.poll_output(),
        Some(HostOutput::Completed {
            token: 3,
            result: Err(HostError::Closed)
        })
    );
}

#[test]
fn host_gives_up_without_ready() {
    let start = Instant::now();
    let mut h = AshHost::new(start);
    h.request(
        Command::Resume {
            session_id: "s".into(),
            turn: None,
        },
        7,
        Instant::now(),
    );
    assert_eq!(h.poll_timeout(), Some(start + READY_TIMEOUT));
    h.handle_timeout(start + READY_TIMEOUT - Duration::from_millis(1));
    assert_eq!(h.poll_output(), None);
    h.handle_timeout(start + READY_TIMEOUT);
    assert_eq!(
        h.poll_output(),
        Some(HostOutput::Completed {
            token: 7,
            result: Err(HostError::ReadyTimeout(READY_TIMEOUT))
        })
    );
    assert_eq!(h.poll_timeout(), None);
    h.request(
        Command::Resume {
            session_id: "s".into(),
            turn: None,
        },
        8,
        Instant::now(),
    );
    assert!(matches!(
        h.poll_output(),
        Some(HostOutput::Completed {
            token: 8,
            result: Err(_)
        })
    ));
}

fn line(c: &mut AshConnection, line: &str) -> Vec<AshBridgeOutput> {
    c.handle_bytes(format!("{line}\n").as_bytes());
    std::iter::from_fn(|| c.poll_output()).collect()
}

#[test]
fn commands_queue_in_order_and_an_interrupt_stops_only_the_running_one() {
    let mut c = AshConnection::new();
    c.poll_output();
    line(&mut c, r#"{"cmd":"query","prompt":"long","sessionId":"a"}"#);
    // Sent right after interrupt, before the agent exited: queued, and runs next.
    let out = line(
        &mut c,
        "{\"cmd\":\"interrupt\"}\n{\"cmd\":\"query\",\"prompt\":\"next\",\"sessionId\":\"b\"}\n{\"cmd\":\"exec\",\"command\":\"ls\"}",
    );
    assert_eq!(out, vec![AshBridgeOutput::StopAgent]);
    c.respond(Answer::Query(Err("killed by SIGINT".into())));
    let out: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
    assert_eq!(
        sent(&out),
        vec![Event::Done {
            session_id: "a".into()
        }]
    );
    let AshBridgeOutput::StartQuery(q) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(q.prompt, raw(r#""next""#), "the queued query runs");
    // A failed turn that printed a result: error, then done.
    c.notify(raw(r#"{"type":"result","is_error":true}"#));
    c.respond(Answer::Query(Err(
        "the agent exited with exit status: 1".into()
    )));
    let out: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
    assert_eq!(
        sent(&out)[1..],
        [
            Event::Error {
                error: "the agent exited with exit status: 1".into()
            },
            Event::Done {
                session_id: "b".into()
            }
        ]
    );
    assert!(matches!(
        out.last(),
        Some(AshBridgeOutput::StartExec { .. })
    ));
}

#[test]
fn the_queue_is_bounded_with_error_then_done() {
    let mut c = AshConnection::new();
    c.poll_output();
    line(&mut c, r#"{"cmd":"query","prompt":"p","sessionId":"run"}"#);
    for i in 0..MAX_QUEUED_COMMANDS {
        let out = line(
            &mut c,
            &format!(r#"{{"cmd":"query","prompt":"p","sessionId":"q{i}"}}"#),
        );
        assert!(out.is_empty());
    }
    let out = line(&mut c, r#"{"cmd":"resume","sessionId":"over"}"#);
    let events = sent(&out);
    assert!(
        matches!(&events[0], Event::Error { error } if error.starts_with("command refused: 32 commands are already waiting")),
        "{events:?}"
    );
    assert_eq!(
        events[1],
        Event::Done {
            session_id: "over".into()
        }
    );
    assert_eq!(c.queued(), MAX_QUEUED_COMMANDS);
    // The host going away drops what waits.
    c.handle_closed();
    assert_eq!(c.queued(), 0);

    // Bytes are bounded too: big prompts stop queueing before the count does.
    let mut c = AshConnection::new();
    c.poll_output();
    line(&mut c, r#"{"cmd":"query","prompt":"p","sessionId":"run"}"#);
    let big = "x".repeat(13 * 1024 * 1024);
    let mut refused = None;
    for i in 0..6 {
        let out = line(
            &mut c,
            &format!(r#"{{"cmd":"query","prompt":"{big}","sessionId":"b{i}"}}"#),
        );
        if !out.is_empty() {
            refused = Some((i, sent(&out)));
            break;
        }
    }
    let (i, events) = refused.expect("a byte bound");
    assert_eq!(i, MAX_QUEUED_BYTES / (13 * 1024 * 1024 + 45));
    assert!(
        matches!(&events[0], Event::Error { error } if error.contains("bytes of commands are already waiting")),
        "{events:?}"
    );
    assert_eq!(
        events[1],
        Event::Done {
            session_id: format!("b{i}")
        }
    );
}

#[test]
fn resume_with_and_without_a_prompt() {
    let mut c = AshConnection::new();
    c.poll_output();
    let out = line(&mut c, r#"{"cmd":"resume","sessionId":"x"}"#);
    assert_eq!(
        out,
        vec![AshBridgeOutput::ResumeSession {
            session_id: "x".into()
        }]
    );
    c.respond(Answer::Resume(Err(
        "no conversation for session \"x\"".into()
    )));
    let out: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
    assert_eq!(
        sent(&out),
        vec![
            Event::Error {
                error: "no conversation for session \"x\"".into()
            },
            Event::Done {
                session_id: "x".into()
            }
        ]
    );
    // With a prompt: the turn runs on the resumed session.
    let out = line(
        &mut c,
        r#"{"cmd":"resume","prompt":"go on","sessionId":"y","model":"m"}"#,
    );
    assert_eq!(
        out,
        vec![AshBridgeOutput::ResumeSession {
            session_id: "y".into()
        }]
    );
    c.respond(Answer::Resume(Ok(())));
    let out: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
    let [AshBridgeOutput::StartQuery(q)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!((q.prompt.get(), q.session_id.as_str()), (r#""go on""#, "y"));
    assert_eq!(q.options.keys().collect::<Vec<_>>(), ["model"]);
    c.respond(Answer::Query(Ok(())));
    assert_eq!(
        sent(&std::iter::from_fn(|| c.poll_output()).collect::<Vec<_>>()),
        vec![Event::Done {
            session_id: "y".into()
        }]
    );
    // Interrupted before the session was resolved: the turn is skipped, done only.
    line(
        &mut c,
        "{\"cmd\":\"resume\",\"prompt\":\"p\",\"sessionId\":\"z\"}\n{\"cmd\":\"interrupt\"}",
    );
    c.respond(Answer::Resume(Ok(())));
    let out: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
    assert_eq!(
        out,
        vec![AshBridgeOutput::Transmit(event_line(&Event::Done {
            session_id: "z".into()
        }))]
    );
    // The command round-trips.
    let resume = br#"{"cmd":"resume","prompt":"p","sessionId":"z","model":"m"}"#;
    let command = decode_command(resume).unwrap();
    let again = command_line(&command);
    assert_eq!(&again[..again.len() - 1], resume);
}
