//! `broker-slow-consumer`: one SSE subscriber that never reads while 600 messages of
//! ~900 KB are addressed to it, and two healthy subscribers timing small messages
//! pushed in between. Reports the broker's peak RSS, its RSS after the stalled
//! client is gone, whether the broker cut the stalled client loose itself, and the
//! healthy subscribers' delivery p50/p99 (compare with `broker-delivery`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::broker::{BrokerChild, client, collect_samples, rt, seq_of, sse_loop};
use super::{Report, peak_rss_kib, percentile, rss_kib};

const BIG_PUSHES: usize = 600;
const BIG_BYTES: usize = 900 * 1024;
const HEALTHY: usize = 2;

/// Opens `GET /subscribe` for `name` on a raw socket, reads the response head, and
/// returns the socket without reading any further.
async fn stalled_subscriber(b: &BrokerChild, name: &str) -> anyhow::Result<tokio::net::TcpStream> {
    let addr = b.url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "GET /subscribe?name={name} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\naccept: text/event-stream\r\n\r\n",
        b.token(name)
    );
    tcp.write_all(req.as_bytes()).await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await? == 0 {
            bail!("the broker closed the stalled subscriber before answering");
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!(
            "stalled subscribe failed: {}",
            String::from_utf8_lossy(&head)
        );
    }
    Ok(tcp)
}

/// Whether the broker closed `tcp` (reads to EOF within `within`; a reset counts as closed).
async fn closed_by_broker(tcp: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = vec![0u8; 1 << 16];
    let read_all = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read_all)
        .await
        .unwrap_or(false)
}

/// The scenario.
pub(crate) fn run() -> anyhow::Result<Report> {
    // m0 stalls; m1..=HEALTHY read.
    let b = BrokerChild::spawn(HEALTHY + 1)?;
    let pid = b.pid();
    let start_rss = rss_kib(pid);
    let (samples, rss_with_stalled, cut, rss_after_cut, elapsed) = rt()?.block_on(async {
        let mut stalled = stalled_subscriber(&b, "m0").await?;
        let sent: Arc<Vec<AtomicU64>> =
            Arc::new((0..BIG_PUSHES).map(|_| AtomicU64::new(0)).collect());
        let origin = Instant::now();
        let ready = Arc::new(AtomicU64::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let mut subs = Vec::new();
        for i in 1..=HEALTHY {
            let name = format!("m{i}");
            let (sent, tx) = (Arc::clone(&sent), tx.clone());
            let mut seen = 0;
            subs.push(tokio::spawn(sse_loop(
                client()?,
                format!("{}/subscribe?name={name}", b.url),
                b.token(&name).to_owned(),
                Arc::clone(&ready),
                move |data| {
                    let now = origin.elapsed().as_micros() as u64;
                    if let Some(at) = seq_of(data).and_then(|s| sent.get(s as usize)) {
                        let _ = tx.send(now.saturating_sub(at.load(Ordering::SeqCst)));
                        seen += 1;
                    }
                    seen < BIG_PUSHES
                },
            )));
        }
        drop(tx);
        while ready.load(Ordering::SeqCst) < HEALTHY as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let http = client()?;
        let url = format!("{}/push", b.url);
        let blob = "x".repeat(BIG_BYTES);
        let healthy: Vec<String> = (1..=HEALTHY).map(|i| format!("m{i}")).collect();
        let started = Instant::now();
        for seq in 0..BIG_PUSHES {
            // ~900 KB to the stalled member only...
            let big =
                serde_json::to_vec(&json!({"to": "m0", "body": "big", "data": {"blob": blob}}))?;
            let r = http
                .post(&url)
                .bearer_auth(b.token("director"))
                .header("content-type", "application/json")
                .body(big)
                .send()
                .await?;
            if !r.status().is_success() {
                bail!("big push failed: {}", r.status());
            }
            r.bytes().await?;
            // ...and a small timed message to each healthy subscriber.
            sent[seq].store(origin.elapsed().as_micros() as u64, Ordering::SeqCst);
            for to in &healthy {
                http.post(&url)
                    .bearer_auth(b.token("director"))
                    .json(&json!({"to": to, "body": "tick", "data": {"seq": seq}}))
                    .send()
                    .await?
                    .bytes()
                    .await?;
            }
        }
        let elapsed = started.elapsed();
        let samples = collect_samples(&mut rx, HEALTHY * BIG_PUSHES).await;
        for s in subs {
            s.abort();
        }
        let rss_with_stalled = rss_kib(pid);
        // Did the broker cut the stalled client loose by itself? (Draining it now only
        // reads what the kernel buffers hold; an open stream would keep the read waiting.)
        let cut = closed_by_broker(&mut stalled, Duration::from_secs(5)).await;
        drop(stalled);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_after_cut = rss_kib(pid);
        Ok::<_, anyhow::Error>((samples, rss_with_stalled, cut, rss_after_cut, elapsed))
    })?;
    let mut r = Report::new();
    r.insert("scenario", json!("broker-slow-consumer"));
    r.insert("big_pushes", json!(BIG_PUSHES));
    r.insert("big_push_bytes", json!(BIG_BYTES));
    r.insert("healthy_subscribers", json!(HEALTHY));
    r.insert("push_seconds", json!(elapsed.as_secs_f64()));
    r.insert("deliveries", json!(samples.len()));
    r.insert("healthy_delivery_p50_us", json!(percentile(&samples, 50.0)));
    r.insert("healthy_delivery_p99_us", json!(percentile(&samples, 99.0)));
    r.insert("broker_start_rss_kib", json!(start_rss));
    r.insert("broker_peak_rss_kib", json!(peak_rss_kib(pid)));
    r.insert(
        "broker_rss_with_stalled_client_kib",
        json!(rss_with_stalled),
    );
    r.insert("stalled_client_cut_by_broker", json!(cut));
    r.insert(
        "broker_rss_after_stalled_client_gone_kib",
        json!(rss_after_cut),
    );
    Ok(r)
}
