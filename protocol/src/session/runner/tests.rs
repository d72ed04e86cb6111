use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

use super::*;
use crate::test_support::{proptest_config, snapshots};

fn raw(text: &str) -> RawJson {
    RawJson::from_text(text).unwrap()
}

fn drain(session: &mut RunnerSession, transcript: &mut String) -> Vec<RunnerOutput> {
    let mut outputs = Vec::new();
    while let Some(output) = session.poll_output() {
        transcript.push_str(&match &output {
            RunnerOutput::Transmit { to: conn, bytes } => {
                let text = String::from_utf8_lossy(bytes);
                text.lines()
                    .map(|l| format!("  to #{} < {l}\n", conn.0))
                    .collect::<String>()
            }
            RunnerOutput::Close { conn } => format!("  close #{}\n", conn.0),
            RunnerOutput::Request(r) => format!(
                "  request #{} id={} {} {}\n",
                r.conn.0,
                r.id,
                r.method,
                r.params.as_ref().map_or("-", RawJson::get)
            ),
            RunnerOutput::Event(RunnerEvent::Responded {
                conn, id, method, ..
            }) => {
                format!("  event Responded #{} id={id} {method}\n", conn.0)
            }
            RunnerOutput::Event(e) => format!("  event {e:?}\n"),
        });
        outputs.push(output);
    }
    outputs
}

fn transmitted(outputs: &[RunnerOutput]) -> Vec<(u64, String)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            RunnerOutput::Transmit { to: conn, bytes } => {
                Some((conn.0, String::from_utf8(bytes.clone()).unwrap()))
            }
            _ => None,
        })
        .collect()
}

/// The connections transmitted to, in order.
fn connections(outputs: &[RunnerOutput]) -> Vec<u64> {
    transmitted(outputs).iter().map(|(c, _)| *c).collect()
}

#[test]
fn scripted_session_displace_respond_notify_shutdown() {
    let mut s = RunnerSession::new(RunnerConfig {
        max_frame_bytes: 512,
        ..RunnerConfig::default()
    });
    let mut t = String::new();
    let mut now = Instant::now();
    let mut step = |label: &str, t: &mut String| {
        now += Duration::from_millis(1);
        t.push_str(label);
        t.push('\n');
        now
    };

    let n = step("notify while no bridge is attached", &mut t);
    s.notify(
        mcp::CLAUDE_CHANNEL,
        Some(raw(r#"{"content":"early","meta":{}}"#)),
        n,
    );
    drain(&mut s, &mut t);
    assert_eq!(s.queued_notifications(), 1);

    let n = step("bridge A connects", &mut t);
    let a = s.handle_connect(Origin::Agent, n);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        transmitted(&out).len(),
        1,
        "the queued notification is delivered on attach"
    );
    assert_eq!(s.attached(), Some(a));

    let n = step("A sends two requests", &mut t);
    s.handle_bytes(
        a,
        b"{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"tools/list\"}\n{\"kind\":\"mcp_request\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"fs_read\",\"arguments\":{}}}\n",
        n,
    );
    drain(&mut s, &mut t);

    let n = step(
        "runner answers 2 with a result too large for a frame",
        &mut t,
    );
    let big = format!(
        r#"{{"content":[{{"type":"text","text":"{}"}}]}}"#,
        "x".repeat(600)
    );
    s.respond(a, 2, Outcome::Result(raw(&big)), n).unwrap();
    let out = drain(&mut s, &mut t);
    let (conn, line) = &transmitted(&out)[0];
    assert_eq!(*conn, a.0);
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["result"]["isError"], true);
    assert!(line.len() <= 512);
    assert_eq!(
        s.respond(a, 2, Outcome::Result(raw("{}")), n),
        Err(RunnerMisuse::NotInFlight { conn: a, id: 2 }),
        "a second answer is a bug in the caller"
    );

    let n = step("A sends a request without a method, then garbage", &mut t);
    s.handle_bytes(a, b"{\"kind\":\"mcp_request\",\"id\":3}\nnot json\n", n);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        transmitted(&out),
        vec![(a.0, "{\"kind\":\"error\",\"message\":\"invalid mcp_request frame: missing \\\"method\\\"\",\"id\":3}\n".to_owned())]
    );

    let n = step("bridge B connects and displaces A", &mut t);
    let b = s.handle_connect(Origin::Agent, n);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        transmitted(&out),
        vec![(
            a.0,
            "{\"kind\":\"shutdown\",\"reason\":\"displaced-by-new-bridge\"}\n".to_owned()
        )]
    );
    assert!(
        !out.contains(&RunnerOutput::Close { conn: a }),
        "A is read until it closes"
    );
    assert_eq!(s.attached(), Some(b));

    let n = step(
        "the answer to A's request 1 arrives late and is dropped",
        &mut t,
    );
    s.respond(a, 1, Outcome::Result(raw(r#"{"tools":[]}"#)), n)
        .unwrap();
    let out = drain(&mut s, &mut t);
    assert!(transmitted(&out).is_empty());

    let n = step("B asks; a notification goes to B", &mut t);
    s.handle_bytes(
        b,
        b"{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"resources/list\"}\n",
        n,
    );
    s.notify(mcp::TOOLS_LIST_CHANGED, None, n);
    s.respond(
        b,
        1,
        Outcome::Error(RpcError::new(
            crate::codec::jsonrpc::METHOD_NOT_FOUND,
            "method not found: resources/list",
        )),
        n,
    )
    .unwrap();
    let out = drain(&mut s, &mut t);
    assert!(transmitted(&out).iter().all(|(c, _)| *c == b.0));

    let n = step("the agent exits: runner shuts down", &mut t);
    s.shutdown(Some("claude-exited-0"), n);
    drain(&mut s, &mut t);
    assert_eq!(s.attached(), None);

    let n = step("a late bridge C connects after shutdown", &mut t);
    let c = s.handle_connect(Origin::Agent, n);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        transmitted(&out),
        vec![(
            c.0,
            "{\"kind\":\"shutdown\",\"reason\":\"claude-exited-0\"}\n".to_owned()
        )]
    );
    assert!(out.contains(&RunnerOutput::Close { conn: c }));
    snapshots(|| insta::assert_snapshot!("runner_scripted_transcript", t));
}

#[test]
fn reject_new_keeps_the_first_bridge() {
    let mut s = RunnerSession::new(RunnerConfig {
        policy: BridgePolicy::RejectNew,
        ..RunnerConfig::default()
    });
    let now = Instant::now();
    let a = s.handle_connect(Origin::Agent, now);
    let b = s.handle_connect(Origin::Agent, now);
    let mut t = String::new();
    let out = drain(&mut s, &mut t);
    assert_eq!(
        transmitted(&out),
        vec![(
            b.0,
            "{\"kind\":\"error\",\"message\":\"runner already attached\"}\n".to_owned()
        )]
    );
    assert!(out.contains(&RunnerOutput::Close { conn: b }));
    assert_eq!(s.attached(), Some(a));
    s.handle_bytes(
        b,
        b"{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"tools/list\"}\n",
        now,
    );
    assert!(
        drain(&mut s, &mut t).is_empty(),
        "a rejected connection is not listened to"
    );
}

#[test]
fn allow_many_keeps_every_bridge_and_routes_responses_to_the_asker() {
    let mut s = RunnerSession::new(RunnerConfig {
        policy: BridgePolicy::AllowMany,
        ..RunnerConfig::default()
    });
    let now = Instant::now();
    let a = s.handle_connect(Origin::Agent, now);
    let b = s.handle_connect(Origin::Agent, now);
    // AllowMany applies within the agent's tree only: an outsider is no bridge of the agent's.
    let outsider = s.handle_connect(Origin::Outsider, now);
    assert_eq!((s.attached_count(), s.outsider_count()), (2, 1));
    let mut t = String::new();
    assert!(
        transmitted(&drain(&mut s, &mut t)).is_empty(),
        "nobody is displaced or rejected"
    );
    s.handle_bytes(
        a,
        b"{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"tools/list\"}\n",
        now,
    );
    s.handle_bytes(
        b,
        b"{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"tools/list\"}\n",
        now,
    );
    drain(&mut s, &mut t);
    s.respond(b, 1, Outcome::Result(raw("{\"tools\":[]}")), now)
        .unwrap();
    let out = drain(&mut s, &mut t);
    assert_eq!(connections(&out), vec![b.0]);
    s.notify("n", None, now);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        connections(&out),
        vec![a.0, b.0],
        "not to the outsider {outsider:?}"
    );
    s.handle_closed(b, now);
    assert_eq!(s.attached(), Some(a));
    s.respond(a, 1, Outcome::Result(raw("{\"tools\":[]}")), now)
        .unwrap();
    assert_eq!(transmitted(&drain(&mut s, &mut t)).len(), 1);
    s.shutdown(Some("bye"), now);
    let out = drain(&mut s, &mut t);
    assert!(out.contains(&RunnerOutput::Close { conn: a }));
    assert_eq!(s.attached_count(), 0);
}

#[test]
fn bridge_shutdown_and_close_detach() {
    let mut s = RunnerSession::new(RunnerConfig::default());
    let now = Instant::now();
    let a = s.handle_connect(Origin::Agent, now);
    s.handle_bytes(
        a,
        b"{\"kind\":\"shutdown\",\"reason\":\"stdio-closed\"}\n",
        now,
    );
    let mut t = String::new();
    let out = drain(&mut s, &mut t);
    assert!(out.contains(&RunnerOutput::Close { conn: a }));
    assert_eq!(s.attached(), None);
    let b = s.handle_connect(Origin::Agent, now);
    s.handle_closed(b, now);
    assert_eq!(s.attached(), None);
    assert_eq!(
        s.respond(IpcConnId(9), 1, Outcome::Result(raw("{}")), now),
        Err(RunnerMisuse::UnknownConnection(IpcConnId(9)))
    );
}

#[test]
fn queue_is_bounded_and_overflow_is_reported() {
    let mut s = RunnerSession::new(RunnerConfig {
        max_queued_notifications: 3,
        ..RunnerConfig::default()
    });
    let now = Instant::now();
    for i in 0..5 {
        s.notify("n", Some(raw(&format!("{{\"i\":{i}}}"))), now);
    }
    let mut t = String::new();
    let out = drain(&mut s, &mut t);
    let dropped: usize = out
        .iter()
        .map(|o| match o {
            RunnerOutput::Event(RunnerEvent::NotificationsDropped { count }) => *count,
            _ => 0,
        })
        .sum();
    assert_eq!(dropped, 2);
    let a = s.handle_connect(Origin::Agent, now);
    let out = drain(&mut s, &mut t);
    let (_, bytes) = &transmitted(&out)[0];
    assert_eq!(
        bytes,
        "{\"kind\":\"mcp_notification\",\"method\":\"n\",\"params\":{\"i\":2},\"seq\":3}\n{\"kind\":\"mcp_notification\",\"method\":\"n\",\"params\":{\"i\":3},\"seq\":4}\n{\"kind\":\"mcp_notification\",\"method\":\"n\",\"params\":{\"i\":4},\"seq\":5}\n"
    );
    assert_eq!(s.attached(), Some(a));
}

#[test]
fn an_outsider_is_served_but_never_displaces_nor_gets_events() {
    let mut s = RunnerSession::new(RunnerConfig::default());
    let now = Instant::now();
    let mut t = String::new();
    s.notify("queued", None, now);
    let outsider = s.handle_connect(Origin::Outsider, now);
    let out = drain(&mut s, &mut t);
    assert!(transmitted(&out).is_empty(), "no queued events: {out:?}");
    assert_eq!(s.attached(), None, "an outsider is not the agent's bridge");
    assert_eq!(s.queued_notifications(), 1, "the queue waits for the agent");

    let agent = s.handle_connect(Origin::Agent, now);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        transmitted(&out),
        vec![(
            agent.0,
            "{\"kind\":\"mcp_notification\",\"method\":\"queued\",\"seq\":1}\n".to_owned()
        )]
    );
    // A second outsider while the agent's bridge is attached: nobody is displaced.
    let second = s.handle_connect(Origin::Outsider, now);
    let out = drain(&mut s, &mut t);
    assert!(
        transmitted(&out).is_empty()
            && !out.iter().any(|o| matches!(o, RunnerOutput::Close { .. }))
    );
    assert_eq!(s.attached(), Some(agent));
    assert_eq!(s.outsider_count(), 2);

    // Served: its request reaches the application and the answer goes back to it.
    s.handle_bytes(
        outsider,
        b"{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"tools/list\"}\n",
        now,
    );
    let out = drain(&mut s, &mut t);
    assert!(
        out.iter()
            .any(|o| matches!(o, RunnerOutput::Request(r) if r.conn == outsider))
    );
    s.respond(outsider, 1, Outcome::Result(raw("{\"tools\":[]}")), now)
        .unwrap();
    let out = drain(&mut s, &mut t);
    assert_eq!(transmitted(&out)[0].0, outsider.0);

    // Live events go to the agent's bridge only.
    s.notify("live", None, now);
    let out = drain(&mut s, &mut t);
    assert_eq!(connections(&out), vec![agent.0]);
    // A new bridge from the agent's tree still displaces the old one.
    let newer = s.handle_connect(Origin::Agent, now);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        transmitted(&out),
        vec![(
            agent.0,
            "{\"kind\":\"shutdown\",\"reason\":\"displaced-by-new-bridge\"}\n".to_owned()
        )]
    );
    assert!(!out.iter().any(|o| matches!(o, RunnerOutput::Close { .. })));
    assert_eq!(s.attached(), Some(newer));

    s.handle_closed(second, now);
    let out = drain(&mut s, &mut t);
    assert!(
        out.contains(&RunnerOutput::Event(RunnerEvent::OutsiderLeft {
            conn: second,
            abandoned: 0
        }))
    );
    s.shutdown(Some("bye"), now);
    let out = drain(&mut s, &mut t);
    assert!(out.contains(&RunnerOutput::Close { conn: outsider }));
    assert!(out.contains(&RunnerOutput::Close { conn: newer }));
    snapshots(|| insta::assert_snapshot!("runner_outsider_transcript", t));
}

/// Bridges of the agent's tree started by other processes (`claude mcp list` run by the agent):
/// one whose client is not the attached bridge's is served but displaces nothing and gets no
/// events; one of the attached bridge's own client (a reconnect) displaces it, as does one the
/// agent started itself; a foreign one still connected when the agent's bridge goes is not
/// promoted: the events wait for the agent's next bridge.
#[test]
fn only_the_attached_bridges_own_client_or_the_agent_displaces_it() {
    const AGENT_CLIENT: u32 = 100;
    const HEALTH_CHECK: u32 = 200;
    let mut s = RunnerSession::new(RunnerConfig::default());
    let now = Instant::now();
    let mut t = String::new();
    s.notify("queued", None, now);
    // With nothing attached, a bridge of another process of the tree is the agent's.
    let first = s.handle_connect(Origin::Client(AGENT_CLIENT), now);
    let out = drain(&mut s, &mut t);
    assert_eq!(connections(&out), vec![first.0], "the queue: {out:?}");
    assert_eq!(s.attached(), Some(first));

    let check = s.handle_connect(Origin::Client(HEALTH_CHECK), now);
    let out = drain(&mut s, &mut t);
    assert!(connections(&out).is_empty(), "nobody displaced: {out:?}");
    assert!(
        out.contains(&RunnerOutput::Event(RunnerEvent::ForeignConnected {
            conn: check,
            client: HEALTH_CHECK,
            attached: first
        }))
    );
    assert_eq!((s.attached(), s.foreign_count()), (Some(first), 1));
    // Served: its tools/list reaches the application and the answer goes back to it.
    s.handle_bytes(
        check,
        b"{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"tools/list\"}\n",
        now,
    );
    assert!(
        drain(&mut s, &mut t)
            .iter()
            .any(|o| matches!(o, RunnerOutput::Request(r) if r.conn == check))
    );
    s.respond(check, 1, Outcome::Result(raw("{\"tools\":[]}")), now)
        .unwrap();
    assert_eq!(connections(&drain(&mut s, &mut t)), vec![check.0]);
    s.notify("live", None, now);
    assert_eq!(connections(&drain(&mut s, &mut t)), vec![first.0]);

    // The agent's client reconnects: it displaces its old bridge.
    let second = s.handle_connect(Origin::Client(AGENT_CLIENT), now);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        connections(&out),
        vec![first.0],
        "shutdown to the old: {out:?}"
    );
    assert_eq!(s.attached(), Some(second));
    // A bridge the agent started itself displaces any.
    let third = s.handle_connect(Origin::Agent, now);
    drain(&mut s, &mut t);
    assert_eq!(s.attached(), Some(third));

    // The agent's bridge goes while the health check's is connected: it is not promoted.
    s.handle_closed(first, now);
    s.handle_closed(second, now);
    s.handle_closed(third, now);
    drain(&mut s, &mut t);
    assert_eq!((s.attached(), s.foreign_count()), (None, 1));
    s.notify("meanwhile", None, now);
    assert!(connections(&drain(&mut s, &mut t)).is_empty());
    let fourth = s.handle_connect(Origin::Client(AGENT_CLIENT), now);
    let out = drain(&mut s, &mut t);
    assert_eq!(connections(&out), vec![fourth.0], "what waited: {out:?}");
    s.handle_closed(check, now);
    let out = drain(&mut s, &mut t);
    assert!(out.contains(&RunnerOutput::Event(RunnerEvent::ForeignLeft {
        conn: check,
        abandoned: 0
    })));
    snapshots(|| insta::assert_snapshot!("runner_foreign_bridge_transcript", t));
}

// ---- model-based test ----

#[derive(Debug, Clone)]
struct Model {
    policy: BridgePolicy,
    next_conn: u64,
    attached: Option<u64>,
    /// The client that started the attached bridge (`None`: the agent itself).
    attached_client: Option<u32>,
    /// Outsiders being served.
    outsiders: BTreeSet<u64>,
    /// Foreign bridges being served (the agent's tree, another client than the attached one's).
    foreign: BTreeSet<u64>,
    /// Connections the peer can still write to (the runner has not closed them).
    open: BTreeSet<u64>,
    /// Requests the application holds and has not answered: (conn, id).
    app_pending: BTreeSet<(u64, u64)>,
    /// Ids each attached connection has in flight.
    in_flight: BTreeMap<u64, BTreeSet<u64>>,
    queued: usize,
    shut_down: bool,
    /// Displaced bridges: told to shut down, still read (and served) until they close.
    draining: BTreeSet<u64>,
}

const QUEUE_LIMIT: usize = 4;

#[derive(Debug, Clone)]
enum Step {
    /// A bridge of the agent's tree, started by the agent (`None`) or by process `Some(pid)`.
    Connect {
        client: Option<u32>,
    },
    ConnectOutsider,
    Request {
        conn: u64,
        id: u64,
    },
    Respond {
        conn: u64,
        id: u64,
    },
    PeerClose {
        conn: u64,
    },
    BridgeShutdown {
        conn: u64,
    },
    MalformedRequest {
        conn: u64,
        id: u64,
    },
    Notify,
    Shutdown,
}

struct RunnerModel;

impl ReferenceStateMachine for RunnerModel {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        prop_oneof![
            Just(BridgePolicy::DisplaceOld),
            Just(BridgePolicy::RejectNew)
        ]
        .prop_map(|policy| Model {
            policy,
            next_conn: 0,
            attached: None,
            attached_client: None,
            outsiders: BTreeSet::new(),
            foreign: BTreeSet::new(),
            open: BTreeSet::new(),
            app_pending: BTreeSet::new(),
            in_flight: BTreeMap::new(),
            queued: 0,
            shut_down: false,
            draining: BTreeSet::new(),
        })
        .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let mut options: Vec<BoxedStrategy<Step>> = vec![
            Just(Step::Connect { client: None }).boxed(),
            (1u32..4)
                .prop_map(|pid| Step::Connect { client: Some(pid) })
                .boxed(),
            Just(Step::ConnectOutsider).boxed(),
            Just(Step::Notify).boxed(),
            Just(Step::Shutdown).boxed(),
        ];
        if !state.open.is_empty() {
            let open: Vec<u64> = state.open.iter().copied().collect();
            let pick = proptest::sample::select(open);
            options.push(
                (pick.clone(), 0u64..6)
                    .prop_map(|(conn, id)| Step::Request { conn, id })
                    .boxed(),
            );
            options.push(
                (pick.clone(), 0u64..6)
                    .prop_map(|(conn, id)| Step::Request { conn, id })
                    .boxed(),
            );
            options.push(
                pick.clone()
                    .prop_map(|conn| Step::PeerClose { conn })
                    .boxed(),
            );
            options.push(
                pick.clone()
                    .prop_map(|conn| Step::BridgeShutdown { conn })
                    .boxed(),
            );
            options.push(
                (pick, 0u64..6)
                    .prop_map(|(conn, id)| Step::MalformedRequest { conn, id })
                    .boxed(),
            );
        }
        if !state.app_pending.is_empty() {
            let pending: Vec<(u64, u64)> = state.app_pending.iter().copied().collect();
            let respond = proptest::sample::select(pending)
                .prop_map(|(conn, id)| Step::Respond { conn, id })
                .boxed();
            options.push(respond.clone());
            options.push(respond);
        }
        proptest::strategy::Union::new(options).boxed()
    }

    fn apply(mut m: Model, step: &Step) -> Model {
        match *step {
            Step::Connect { client } => {
                let conn = m.next_conn;
                m.next_conn += 1;
                if m.shut_down {
                    return m;
                }
                if client.is_some() && m.attached.is_some() && m.attached_client != client {
                    m.foreign.insert(conn);
                    m.open.insert(conn);
                    m.in_flight.insert(conn, BTreeSet::new());
                    return m;
                }
                match (m.attached, m.policy) {
                    (Some(_), BridgePolicy::RejectNew) => {}
                    (old, _) => {
                        if let Some(old) = old {
                            // Displaced: read until it closes, never cut off.
                            m.draining.insert(old);
                            m.in_flight.remove(&old);
                        }
                        m.attached = Some(conn);
                        m.attached_client = client;
                        m.open.insert(conn);
                        m.in_flight.insert(conn, BTreeSet::new());
                        m.queued = 0;
                    }
                }
            }
            Step::ConnectOutsider => {
                let conn = m.next_conn;
                m.next_conn += 1;
                if !m.shut_down {
                    m.outsiders.insert(conn);
                    m.open.insert(conn);
                    m.in_flight.insert(conn, BTreeSet::new());
                }
            }
            Step::Request { conn, id } => {
                if m.served(conn) {
                    let ids = m.in_flight.entry(conn).or_default();
                    if ids.insert(id) {
                        m.app_pending.insert((conn, id));
                    }
                }
            }
            Step::MalformedRequest { .. } => {}
            Step::Respond { conn, id } => {
                m.app_pending.remove(&(conn, id));
                if let Some(ids) = m.in_flight.get_mut(&conn) {
                    ids.remove(&id);
                }
            }
            Step::PeerClose { conn } | Step::BridgeShutdown { conn } => {
                m.open.remove(&conn);
                m.in_flight.remove(&conn);
                m.outsiders.remove(&conn);
                m.foreign.remove(&conn);
                m.draining.remove(&conn);
                if m.attached == Some(conn) {
                    m.attached = None;
                }
            }
            Step::Notify => {
                if m.attached.is_none() && !m.shut_down {
                    m.queued = (m.queued + 1).min(QUEUE_LIMIT);
                }
            }
            Step::Shutdown => {
                let served_only = std::mem::take(&mut m.outsiders)
                    .into_iter()
                    .chain(std::mem::take(&mut m.foreign));
                for conn in served_only {
                    m.open.remove(&conn);
                    m.in_flight.remove(&conn);
                }
                if let Some(conn) = m.attached.take() {
                    m.open.remove(&conn);
                    m.in_flight.remove(&conn);
                }
                for conn in std::mem::take(&mut m.draining) {
                    m.open.remove(&conn);
                    m.in_flight.remove(&conn);
                }
                m.shut_down = true;
                m.queued = 0;
            }
        }
        m
    }
}

impl Model {
    /// Whether requests from `conn` are served (the agent's bridge, an outsider or a foreign
    /// bridge; a displaced bridge is only read for its acknowledgements and its end).
    fn served(&self, conn: u64) -> bool {
        self.attached == Some(conn)
            || self.outsiders.contains(&conn)
            || self.foreign.contains(&conn)
    }
}

struct Sut {
    session: RunnerSession,
    now: Instant,
    /// Model state before the step, to check the outputs against.
    before: Model,
}

impl StateMachineTest for RunnerModel {
    type SystemUnderTest = Sut;
    type Reference = RunnerModel;

    fn init_test(model: &Model) -> Sut {
        Sut {
            session: RunnerSession::new(RunnerConfig {
                policy: model.policy,
                max_frame_bytes: 1024,
                max_queued_notifications: QUEUE_LIMIT,
            }),
            now: Instant::now(),
            before: model.clone(),
        }
    }

    fn apply(mut sut: Sut, after: &Model, step: Step) -> Sut {
        let before = std::mem::replace(&mut sut.before, after.clone());
        sut.now += Duration::from_millis(1);
        let now = sut.now;
        let s = &mut sut.session;
        match step {
            Step::Connect { client } => {
                let origin = client.map_or(Origin::Agent, Origin::Client);
                let conn = s.handle_connect(origin, now);
                assert_eq!(conn.0, before.next_conn);
            }
            Step::ConnectOutsider => {
                let conn = s.handle_connect(Origin::Outsider, now);
                assert_eq!(conn.0, before.next_conn);
            }
            Step::Request { conn, id } => s.handle_bytes(
                IpcConnId(conn),
                format!("{{\"kind\":\"mcp_request\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"t{id}\"}}}}\n").as_bytes(),
                now,
            ),
            Step::MalformedRequest { conn, id } => s.handle_bytes(
                IpcConnId(conn),
                format!("{{\"kind\":\"mcp_request\",\"id\":{id}}}\n").as_bytes(),
                now,
            ),
            Step::Respond { conn, id } => s
                .respond(IpcConnId(conn), id, Outcome::Result(mcp::tool_text(&format!("r{id}"))), now)
                .expect("the model only answers requests the session handed out"),
            Step::PeerClose { conn } => s.handle_closed(IpcConnId(conn), now),
            Step::BridgeShutdown { conn } => {
                s.handle_bytes(IpcConnId(conn), b"{\"kind\":\"shutdown\"}\n", now)
            }
            Step::Notify => s.notify("n", None, now),
            Step::Shutdown => s.shutdown(Some("bye"), now),
        }
        let mut outputs = Vec::new();
        while let Some(o) = s.poll_output() {
            outputs.push(o);
        }
        check_outputs(&before, &step, &outputs);
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        assert_eq!(sut.session.attached().map(|c| c.0), model.attached);
        assert_eq!(sut.session.outsider_count(), model.outsiders.len());
        assert_eq!(sut.session.foreign_count(), model.foreign.len());
        assert_eq!(sut.session.draining_count(), model.draining.len());
        assert_eq!(sut.session.queued_notifications(), model.queued);
        assert_eq!(sut.session.is_shut_down(), model.shut_down);
    }
}

fn frames_to(outputs: &[RunnerOutput], conn: u64) -> Vec<serde_json::Value> {
    outputs
        .iter()
        .filter_map(|o| match o {
            RunnerOutput::Transmit { to: c, bytes } if c.0 == conn => Some(bytes),
            _ => None,
        })
        .flat_map(|b| {
            String::from_utf8(b.clone())
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn check_outputs(before: &Model, step: &Step, outputs: &[RunnerOutput]) {
    let targets: BTreeSet<u64> = outputs
        .iter()
        .filter_map(|o| match o {
            RunnerOutput::Transmit { to: conn, .. } | RunnerOutput::Close { conn } => Some(conn.0),
            _ => None,
        })
        .collect();
    let closes: Vec<u64> = outputs
        .iter()
        .filter_map(|o| match o {
            RunnerOutput::Close { conn } => Some(conn.0),
            _ => None,
        })
        .collect();
    let requests: Vec<(u64, u64)> = outputs
        .iter()
        .filter_map(|o| match o {
            RunnerOutput::Request(r) => Some((r.conn.0, r.id)),
            _ => None,
        })
        .collect();
    match *step {
        Step::Connect { client } => {
            let new = before.next_conn;
            let foreign =
                client.is_some() && before.attached.is_some() && before.attached_client != client;
            if before.shut_down {
                assert_eq!(frames_to(outputs, new)[0]["kind"], "shutdown");
                assert_eq!(closes, vec![new]);
            } else if foreign {
                assert!(
                    targets.is_empty(),
                    "a foreign bridge displaces nobody and gets no queued events: {outputs:?}"
                );
            } else if let Some(old) = before.attached {
                match before.policy {
                    BridgePolicy::DisplaceOld => {
                        let to_old = frames_to(outputs, old);
                        assert_eq!(to_old.len(), 1);
                        assert_eq!(to_old[0]["reason"], DISPLACED_REASON);
                        assert!(
                            closes.is_empty(),
                            "the displaced bridge is read until it closes"
                        );
                    }
                    BridgePolicy::RejectNew => {
                        assert_eq!(frames_to(outputs, new)[0]["message"], ALREADY_ATTACHED);
                        assert_eq!(closes, vec![new]);
                    }
                    BridgePolicy::AllowMany => {
                        unreachable!(
                            "the model covers the single-bridge policies; AllowMany has its own tests"
                        )
                    }
                }
            } else {
                assert!(closes.is_empty());
                let delivered = frames_to(outputs, new);
                assert_eq!(
                    delivered.len(),
                    before.queued,
                    "queued notifications delivered on attach"
                );
                assert!(delivered.iter().all(|f| f["kind"] == "mcp_notification"));
            }
        }
        Step::ConnectOutsider => {
            let new = before.next_conn;
            if before.shut_down {
                assert_eq!(frames_to(outputs, new)[0]["kind"], "shutdown");
                assert_eq!(closes, vec![new]);
            } else {
                assert!(
                    targets.is_empty(),
                    "an outsider displaces nobody and gets no queued events: {outputs:?}"
                );
            }
        }
        Step::Request { conn, id } => {
            let fresh = before.served(conn)
                && !before
                    .in_flight
                    .get(&conn)
                    .is_some_and(|ids| ids.contains(&id));
            if fresh {
                assert_eq!(requests, vec![(conn, id)]);
                assert!(targets.is_empty());
            } else if before.served(conn) {
                assert!(requests.is_empty());
                let errors = frames_to(outputs, conn);
                assert_eq!(errors.len(), 1);
                assert_eq!(errors[0]["kind"], "error");
                assert_eq!(errors[0]["id"], id);
            } else {
                assert!(
                    outputs.is_empty(),
                    "bytes from a connection that is not attached are ignored"
                );
            }
        }
        Step::MalformedRequest { conn, id } => {
            assert!(requests.is_empty());
            if before.served(conn) && !before.in_flight[&conn].contains(&id) {
                let errors = frames_to(outputs, conn);
                assert_eq!(errors.len(), 1);
                assert_eq!(errors[0]["id"], id);
            } else {
                assert!(targets.is_empty());
            }
        }
        Step::Respond { conn, id } => {
            if before.served(conn) {
                let frames = frames_to(outputs, conn);
                assert_eq!(frames.len(), 1);
                assert_eq!(frames[0]["kind"], "mcp_response");
                assert_eq!(frames[0]["id"], id);
                assert_eq!(
                    targets,
                    BTreeSet::from([conn]),
                    "a response goes only to who asked"
                );
            } else {
                assert!(
                    targets.is_empty(),
                    "a response for a connection that is gone is dropped"
                );
            }
        }
        Step::PeerClose { .. } => assert!(targets.is_empty()),
        Step::BridgeShutdown { conn } => {
            if before.served(conn) || before.draining.contains(&conn) {
                assert_eq!(closes, vec![conn]);
            } else {
                assert!(targets.is_empty());
            }
        }
        Step::Notify => match before.attached {
            Some(conn) if !before.shut_down => {
                let frames = frames_to(outputs, conn);
                assert_eq!(frames.len(), 1);
                assert_eq!(frames[0]["kind"], "mcp_notification");
                assert_eq!(targets, BTreeSet::from([conn]), "never to an outsider");
            }
            _ => assert!(targets.is_empty()),
        },
        Step::Shutdown => {
            let mut served: BTreeSet<u64> = before.outsiders.clone();
            served.extend(before.foreign.iter().copied());
            served.extend(before.attached);
            served.extend(before.draining.iter().copied());
            if before.shut_down {
                assert!(targets.is_empty());
            } else {
                for conn in &served {
                    assert_eq!(frames_to(outputs, *conn)[0]["kind"], "shutdown");
                }
                assert_eq!(closes.iter().copied().collect::<BTreeSet<_>>(), served);
            }
        }
    }
}

prop_state_machine! {
    #![proptest_config(proptest_config("runner_model"))]

    #[test]
    fn runner_session_matches_the_model(sequential 1..60 => RunnerModel);
}

/// Bytes of `ack` frames for `seqs`.
fn acks(seqs: &[u64]) -> Vec<u8> {
    seqs.iter()
        .flat_map(|s| format!("{{\"kind\":\"ack\",\"seq\":{s}}}\n").into_bytes())
        .collect()
}

fn redelivered(outputs: &[RunnerOutput]) -> Vec<(u64, Option<u64>, usize)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            RunnerOutput::Event(RunnerEvent::Redelivered { from, to, count }) => {
                Some((from.0, to.map(|c| c.0), *count))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn what_a_closing_bridge_never_wrote_goes_to_the_next_one_once() {
    let mut s = RunnerSession::new(RunnerConfig::default());
    let now = Instant::now();
    let mut t = String::new();
    let a = s.handle_connect(Origin::Agent, now);
    s.handle_bytes(a, &acks(&[0]), now);
    for i in 1..=3 {
        s.notify("n", Some(raw(&format!("{{\"i\":{i}}}"))), now);
    }
    // It wrote the first, then went away.
    s.handle_bytes(a, &acks(&[1]), now);
    s.handle_closed(a, now);
    let out = drain(&mut s, &mut t);
    assert_eq!(redelivered(&out), vec![(a.0, None, 2)]);
    assert_eq!(s.queued_notifications(), 2);
    let b = s.handle_connect(Origin::Agent, now);
    let out = drain(&mut s, &mut t);
    let sent = transmitted(&out);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].1.contains("\"seq\":2") && sent[0].1.contains("\"seq\":3"));
    assert!(
        !sent[0].1.contains("\"seq\":1"),
        "the written one is not sent again"
    );
    assert_eq!(sent[0].0, b.0);
}

#[test]
fn a_displaced_bridge_is_read_until_it_closes_and_the_rest_handed_on() {
    let mut s = RunnerSession::new(RunnerConfig::default());
    let now = Instant::now();
    let mut t = String::new();
    let a = s.handle_connect(Origin::Agent, now);
    s.notify("n", Some(raw("{\"i\":1}")), now);
    s.notify("n", Some(raw("{\"i\":2}")), now);
    drain(&mut s, &mut t);
    let b = s.handle_connect(Origin::Agent, now);
    let out = drain(&mut s, &mut t);
    assert!(
        !out.iter()
            .any(|o| matches!(o, RunnerOutput::Close { conn } if *conn == a)),
        "the displaced bridge is not cut off before it is read"
    );
    s.notify("n", Some(raw("{\"i\":3}")), now);
    let out = drain(&mut s, &mut t);
    assert_eq!(
        connections(&out),
        vec![b.0],
        "new ones go to the new bridge only"
    );
    // Its first bytes (read only now) say it acknowledges; it wrote the first and closed.
    s.handle_bytes(a, &acks(&[0, 1]), now);
    s.handle_closed(a, now);
    let out = drain(&mut s, &mut t);
    assert_eq!(redelivered(&out), vec![(a.0, Some(b.0), 1)]);
    let sent = transmitted(&out);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].1.contains("\"seq\":2"));
}

#[test]
fn bridges_that_do_not_acknowledge_and_many_bridges_get_nothing_handed_on() {
    // A bridge that never said it acknowledges: what it was sent counts as delivered.
    let mut s = RunnerSession::new(RunnerConfig::default());
    let now = Instant::now();
    let mut t = String::new();
    let a = s.handle_connect(Origin::Agent, now);
    s.notify("n", None, now);
    s.handle_closed(a, now);
    let out = drain(&mut s, &mut t);
    assert!(redelivered(&out).is_empty());
    assert_eq!(s.queued_notifications(), 0);
    // Under AllowMany every bridge got a copy already.
    let mut s = RunnerSession::new(RunnerConfig {
        policy: BridgePolicy::AllowMany,
        ..RunnerConfig::default()
    });
    let a = s.handle_connect(Origin::Agent, now);
    let _b = s.handle_connect(Origin::Agent, now);
    s.handle_bytes(a, &acks(&[0]), now);
    s.notify("n", None, now);
    s.handle_closed(a, now);
    let out = drain(&mut s, &mut t);
    assert!(redelivered(&out).is_empty());
}
