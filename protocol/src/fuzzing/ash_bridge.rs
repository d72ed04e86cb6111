//! The oracle of the `ash_bridge` fuzz target: a host and an agent against an [`AshConnection`](crate::dialect::ash::bridge::AshConnection).

use super::{Input, MAX_POLLS};
use crate::codec::json::RawJson;
use crate::dialect::ash;
use crate::dialect::ash::bridge::{Answer, AshBridgeOutput, AshConnection};

/// `ash_bridge`: a host and an agent doing arbitrary things to an [`AshConnection`].
///
/// Oracles: `ready` comes first; every line sent is a valid event; at most one command runs; no
/// `message` goes out while no query runs; every `query`, `resume` and `exec` the connection
/// reads (decoded again by the oracle from the same bytes) ends with exactly one `done` naming
/// the session that command named (`""` for exec) once the turns finish, whether it ran or was
/// refused by the bounded queue, unless the host went away; `poll_output` terminates.
pub fn ash_bridge_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let max_line = 64 + usize::from(input.byte()) * 4;
    let mut conn = AshConnection::with_max_line(max_line);
    let mut shadow = crate::codec::line::LineDecoder::new(max_line);
    let mut expected: Vec<String> = Vec::new();
    let mut dones: Vec<String> = Vec::new();
    let mut running: Option<&'static str> = None;
    let mut closed = false;
    let mut first = true;
    const COMMANDS: [&str; 8] = [
        r#"{"cmd":"query","prompt":"p","sessionId":"s"}"#,
        r#"{"cmd":"query","prompt":[{"type":"text","text":"p"}],"sessionId":"t","model":"m"}"#,
        r#"{"cmd":"exec","command":"true","timeout":10}"#,
        r#"{"cmd":"resume","sessionId":"r"}"#,
        r#"{"cmd":"resume","prompt":"p","sessionId":"u"}"#,
        r#"{"cmd":"interrupt"}"#,
        r#"{"cmd":"query","sessionId":"s"}"#,
        r#"{"cmd":"shutdown"}"#,
    ];
    let mut feed = |conn: &mut AshConnection, bytes: &[u8], expected: &mut Vec<String>| {
        conn.handle_bytes(bytes);
        shadow.push(bytes);
        while let Some(line) = shadow.decode() {
            if let crate::codec::line::Line::Complete(line) = line {
                match ash::decode_command(line) {
                    Ok(ash::Command::Query(q)) => expected.push(q.session_id),
                    Ok(ash::Command::Resume { session_id, .. }) => expected.push(session_id),
                    Ok(ash::Command::Exec { .. }) => expected.push(String::new()),
                    _ => {}
                }
            }
        }
    };
    let mut drain = |conn: &mut AshConnection, running: &mut Option<&'static str>| {
        let mut polls = 0;
        while let Some(output) = conn.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                AshBridgeOutput::Transmit(line) => {
                    let event = ash::decode_event(&line[..line.len() - 1]).expect("valid event");
                    assert_eq!(first, event == ash::Event::Ready, "ready comes first, once");
                    first = false;
                    match event {
                        ash::Event::Done { session_id } => dones.push(session_id),
                        ash::Event::Message { .. } => {
                            assert_eq!(*running, Some("query"), "message outside a query")
                        }
                        _ => {}
                    }
                }
                AshBridgeOutput::StartQuery(_) => {
                    assert!(running.is_none(), "two turns at once");
                    *running = Some("query");
                }
                AshBridgeOutput::StartExec { .. } => {
                    assert!(running.is_none(), "two turns at once");
                    *running = Some("exec");
                }
                AshBridgeOutput::ResumeSession { .. } => {
                    assert!(running.is_none(), "two turns at once");
                    *running = Some("resume");
                }
                AshBridgeOutput::StopAgent | AshBridgeOutput::Shutdown => {}
            }
        }
    };
    loop {
        drain(&mut conn, &mut running);
        if input.is_empty() {
            break;
        }
        match input.byte() % 8 {
            0..=2 => {
                let mut line = COMMANDS[input.below(COMMANDS.len())].as_bytes().to_vec();
                line.push(b'\n');
                let split = input.below(line.len() + 1);
                feed(&mut conn, &line[..split], &mut expected);
                feed(&mut conn, &line[split..], &mut expected);
            }
            3 => {
                let bytes = input.bytes(80);
                feed(&mut conn, bytes, &mut expected);
            }
            4 => conn.notify(RawJson::from_text("{}").expect("valid JSON")),
            5 if running == Some("query") => {
                running = None;
                conn.respond(Answer::Query(if input.byte().is_multiple_of(2) {
                    Ok(())
                } else {
                    Err("x".into())
                }));
            }
            5 if running == Some("resume") => {
                running = None;
                conn.respond(Answer::Resume(if input.byte().is_multiple_of(2) {
                    Ok(())
                } else {
                    Err("x".into())
                }));
            }
            6 if running == Some("exec") => {
                running = None;
                conn.respond(Answer::Exec {
                    exit_code: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                });
            }
            _ => {
                closed = true;
                conn.handle_closed();
            }
        }
    }
    if closed {
        return;
    }
    // Finish whatever runs until the queue is empty.
    while let Some(kind) = running.take() {
        match kind {
            "query" => conn.respond(Answer::Query(Ok(()))),
            "resume" => conn.respond(Answer::Resume(Ok(()))),
            _ => conn.respond(Answer::Exec {
                exit_code: 0,
                stdout: String::new(),
                stderr: String::new(),
            }),
        }
        drain(&mut conn, &mut running);
    }
    assert!(
        !conn.is_busy() && conn.queued() == 0,
        "a command was left behind"
    );
    expected.sort();
    dones.sort();
    assert_eq!(
        dones, expected,
        "each command ends with exactly one done for its session"
    );
}
