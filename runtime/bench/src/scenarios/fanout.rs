//! `ac7-bench fanout`: one broadcast to 100 live streams, as SSE and as WebSocket, against a
//! do-nothing fan-out server ([`super::floor`]: a minimal tokio server writing the same kind of
//! bytes to 100 held connections) in the same run.
//!
//! The client is one thread with blocking HTTP for the push and `poll(2)` over the 100 stream
//! sockets: a round writes one `POST /push` (a broadcast from the director to the 100 members,
//! one stream each) and reads every socket until each has the round's marker; the time from the
//! request's first byte to the first and to the last stream that has it is recorded. Rounds
//! against the broker and against the floor server alternate; the broker's streams are SSE in
//! one phase and WebSocket in the next (two phases each, the streams reopened for each), so at
//! any time every stream of the broker is of one kind.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::Latency;
use super::broker::BrokerChild;
use super::e2e::{FloorServer, Http};
use super::floor::find;

const STREAMS: usize = 100;
const ROUNDS_PER_PHASE: usize = 100;
const WARMUP_ROUNDS: usize = 10;
/// `<kind>:<seconds>` (`sse`, `websocket`, `floor`): before measuring, rounds of that kind alone
/// run for that long, for a profiler to attach to the broker.
const ENV_PROFILE: &str = "AC7_BENCH_FANOUT_PROFILE";

/// Pause between rounds, so each is measured on its own.
const GAP: Duration = Duration::from_millis(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sse,
    WebSocket,
    Floor,
}

/// One held stream: its socket, what arrived this round, and when the marker did.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    at: Option<Duration>,
}

/// Opens a stream: sends `request`, reads the response head (which must have `status`), and
/// leaves the socket non-blocking.
fn open(addr: &str, request: &str, status: &str) -> anyhow::Result<Conn> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(request.as_bytes())?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while find(&head, b"\r\n\r\n").is_none() {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the stream before answering");
        }
        head.extend_from_slice(&chunk[..n]);
    }
    if !head.starts_with(format!("HTTP/1.1 {status}").as_bytes()) {
        bail!(
            "stream refused: {}",
            String::from_utf8_lossy(&head).lines().next().unwrap_or("")
        );
    }
    stream.set_nonblocking(true)?;
    Ok(Conn {
        stream,
        buf: Vec::with_capacity(4096),
        at: None,
    })
}

/// The 100 streams of one kind.
fn open_all(kind: Kind, addr: &str, broker: Option<&BrokerChild>) -> anyhow::Result<Vec<Conn>> {
    (0..STREAMS)
        .map(|i| {
            let name = format!("m{i}");
            let token = broker.map_or("", |b| b.token(&name));
            match kind {
                Kind::Sse => open(
                    addr,
                    &format!(
                        "GET /subscribe?name={name} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\naccept: text/event-stream\r\n\r\n"
                    ),
                    "200",
                ),
                Kind::WebSocket => open(
                    addr,
                    &format!(
                        "GET /subscribe?name={name} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
                    ),
                    "101",
                ),
                Kind::Floor => open(
                    addr,
                    &format!("GET /subscribe HTTP/1.1\r\nhost: {addr}\r\n\r\n"),
                    "200",
                ),
            }
        })
        .collect()
}

/// One round: the push, then every stream read until it has `marker`. (first, last) arrival.
fn round(
    conns: &mut [Conn],
    http: &mut Http,
    token: &str,
    body: &[u8],
    marker: &[u8],
) -> anyhow::Result<(Duration, Duration)> {
    for c in conns.iter_mut() {
        c.buf.clear();
        c.at = None;
    }
    let mut chunk = vec![0u8; 64 * 1024];
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(conns.len());
    let mut index: Vec<usize> = Vec::with_capacity(conns.len());
    let t = Instant::now();
    http.send_post("/push", token, body)?;
    let mut left = conns.len();
    while left > 0 {
        fds.clear();
        index.clear();
        for (i, c) in conns.iter().enumerate() {
            if c.at.is_none() {
                fds.push(libc::pollfd {
                    fd: c.stream.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                index.push(i);
            }
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10_000) };
        if ready < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err.into());
        }
        if ready == 0 {
            bail!("{left} streams never got the broadcast");
        }
        for (fd, &i) in fds.iter().zip(&index) {
            if fd.revents == 0 {
                continue;
            }
            let c = &mut conns[i];
            loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => bail!("a stream closed"),
                    Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if find(&c.buf, marker).is_some() {
                c.at = Some(t.elapsed());
                left -= 1;
            }
        }
    }
    let status = http.read_response()?;
    if !(200..300).contains(&status) {
        bail!("the push answered {status}");
    }
    let first = conns.iter().filter_map(|c| c.at).min().unwrap_or_default();
    let last = conns.iter().filter_map(|c| c.at).max().unwrap_or_default();
    Ok((first, last))
}

#[derive(Default)]
struct Samples {
    first: Vec<Duration>,
    last: Vec<Duration>,
}

impl Samples {
    fn report(&mut self) -> anyhow::Result<Value> {
        Ok(json!({
            "last_received": Latency::of(&mut self.last).context("no samples")?,
            "first_received": Latency::of(&mut self.first).context("no samples")?,
        }))
    }
}

/// Runs the scenario.
pub(crate) fn run() -> anyhow::Result<Value> {
    let broker = BrokerChild::spawn(STREAMS)?;
    let floor = FloorServer::spawn()?;
    let broker_addr = broker
        .url
        .strip_prefix("http://")
        .context("broker URL")?
        .to_owned();
    let token = broker.token("director").to_owned();
    let mut floor_conns = open_all(Kind::Floor, &floor.addr, None)?;
    let mut floor_http = Http::connect(&floor.addr)?;
    let mut broker_http = Http::connect(&broker_addr)?;
    let (mut sse, mut ws, mut nothing) =
        (Samples::default(), Samples::default(), Samples::default());
    let mut seq = 0u64;
    let mut frame_bytes = 0;
    // For profilers: one kind alone for a while, before the measurements.
    if let Ok(spec) = std::env::var(ENV_PROFILE) {
        let (kind, secs) = spec.split_once(':').context(ENV_PROFILE)?;
        let kind = match kind {
            "sse" => Kind::Sse,
            "websocket" => Kind::WebSocket,
            "floor" => Kind::Floor,
            other => bail!("{ENV_PROFILE}: unknown kind {other}"),
        };
        let until = Instant::now() + Duration::from_secs(secs.parse()?);
        let (addr, http, token) = if kind == Kind::Floor {
            (floor.addr.clone(), &mut floor_http, "")
        } else {
            (broker_addr.clone(), &mut broker_http, token.as_str())
        };
        let mut conns = open_all(kind, &addr, Some(&broker))?;
        while Instant::now() < until {
            seq += 1;
            let marker = format!("fx{seq}.");
            let body = format!(r#"{{"body":"{marker}"}}"#);
            round(&mut conns, http, token, body.as_bytes(), marker.as_bytes())?;
            std::thread::sleep(GAP);
        }
    }
    for kind in [Kind::Sse, Kind::WebSocket, Kind::Sse, Kind::WebSocket] {
        let mut conns = open_all(kind, &broker_addr, Some(&broker))?;
        std::thread::sleep(Duration::from_millis(300));
        for r in 0..WARMUP_ROUNDS + ROUNDS_PER_PHASE {
            seq += 1;
            let marker = format!("fx{seq}.");
            let body = format!(r#"{{"body":"{marker}"}}"#);
            let (first, last) = round(
                &mut conns,
                &mut broker_http,
                &token,
                body.as_bytes(),
                marker.as_bytes(),
            )?;
            frame_bytes = conns[0].buf.len();
            let ours = if kind == Kind::Sse { &mut sse } else { &mut ws };
            if r >= WARMUP_ROUNDS {
                ours.first.push(first);
                ours.last.push(last);
            }
            std::thread::sleep(GAP);
            // The floor writes a frame of about the broker's size.
            let pad = "x".repeat(frame_bytes.saturating_sub(body.len() + 20));
            let floor_body = format!(r#"{{"body":"{marker}","pad":"{pad}"}}"#);
            let (first, last) = round(
                &mut floor_conns,
                &mut floor_http,
                "",
                floor_body.as_bytes(),
                marker.as_bytes(),
            )?;
            if r >= WARMUP_ROUNDS {
                nothing.first.push(first);
                nothing.last.push(last);
            }
            std::thread::sleep(GAP);
        }
        drop(conns);
        std::thread::sleep(Duration::from_millis(300));
    }
    let (sse, ws, nothing) = (sse.report()?, ws.report()?, nothing.report()?);
    let p50 = |v: &Value| v["last_received"]["p50_us"].as_f64().unwrap_or(f64::NAN);
    Ok(json!({
        "scenario": "fanout",
        "streams": STREAMS,
        "rounds": 2 * ROUNDS_PER_PHASE,
        "frame_bytes": frame_bytes,
        "sse": sse,
        "websocket": ws,
        "floor": nothing,
        "ratio_sse_over_floor_p50": p50(&sse) / p50(&nothing),
        "ratio_websocket_over_floor_p50": p50(&ws) / p50(&nothing),
        "ratio_websocket_over_sse_p50": p50(&ws) / p50(&sse),
    }))
}
