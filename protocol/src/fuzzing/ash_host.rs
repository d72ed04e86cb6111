//! The oracle of the `ash_host` fuzz target: a bridge's events against an [`AshHost`](crate::dialect::ash::host::AshHost).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{Input, MAX_POLLS};
use crate::dialect::ash;
use crate::dialect::ash::host::{AshHost, HostOutput};

/// `ash_host`: a bridge sending arbitrary events to an [`AshHost`] while commands are submitted.
///
/// Oracles: nothing is sent before `ready`; at most one command is on the wire; every submission
/// completes at most once, and all of them once the connection closes; `poll_output` terminates.
pub fn ash_host_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let start = Instant::now();
    let mut now = start;
    let mut host = AshHost::new(now);
    let mut submitted = 0u32;
    let mut completed = BTreeSet::new();
    let mut on_wire = 0u32;
    let mut ready = false;
    const EVENTS: [&str; 7] = [
        r#"{"ev":"ready"}"#,
        r#"{"ev":"message","data":{"type":"assistant"}}"#,
        r#"{"ev":"error","error":"e"}"#,
        r#"{"ev":"done","sessionId":"s"}"#,
        r#"{"ev":"exec_result","exitCode":1,"stdout":"","stderr":"x"}"#,
        r#"{"ev":"done"}"#,
        r#"{"cmd":"query"}"#,
    ];
    loop {
        let mut polls = 0;
        while let Some(output) = host.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                HostOutput::Transmit(line) => {
                    assert!(ready, "sent before ready");
                    match ash::decode_command(&line[..line.len() - 1]).expect("valid command") {
                        ash::Command::Interrupt | ash::Command::Shutdown => {}
                        _ => {
                            on_wire += 1;
                            assert!(on_wire <= 1, "two commands on the wire");
                        }
                    }
                }
                HostOutput::Ready => ready = true,
                HostOutput::Completed { token, result } => {
                    assert!(completed.insert(token), "completed twice");
                    if result.is_ok() {
                        on_wire = 0;
                    }
                }
                HostOutput::Message { .. } | HostOutput::InvalidEvent(_) => {}
            }
        }
        if input.is_empty() {
            break;
        }
        match input.byte() % 6 {
            0 | 1 => {
                let command = match input.byte() % 3 {
                    0 => ash::Command::Resume {
                        session_id: "s".into(),
                        turn: None,
                    },
                    1 => ash::Command::Exec {
                        command: "c".into(),
                        timeout_ms: 1,
                    },
                    _ => ash::Command::Interrupt,
                };
                if !matches!(command, ash::Command::Interrupt) {
                    submitted += 1;
                    host.request(command, submitted, now);
                } else {
                    host.request(command, 0, now);
                }
            }
            2 | 3 => {
                let mut line = EVENTS[input.below(EVENTS.len())].as_bytes().to_vec();
                line.push(b'\n');
                host.handle_bytes(&line, now);
            }
            4 => host.handle_bytes(input.bytes(40), now),
            _ => {
                now += Duration::from_secs(u64::from(input.byte() % 12));
                host.handle_timeout(now);
            }
        }
    }
    host.handle_closed(now);
    while let Some(output) = host.poll_output() {
        if let HostOutput::Completed { token, .. } = output {
            assert!(completed.insert(token), "completed twice");
        }
    }
    assert_eq!(
        completed.len() as u32,
        submitted,
        "every submission completes"
    );
}
