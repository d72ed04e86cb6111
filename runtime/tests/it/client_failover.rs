//! Clients given several broker URLs (replicas of one team): the operator verbs move past a
//! URL where nothing listens and past one that answers 502/503/504, and never past a 500 (the
//! request may have been carried out there).

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::process::Command;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::broker_support::start_broker;
use crate::common;

/// A loopback port where nothing listens.
async fn dead_url() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

/// A stand-in that answers every request with `status` and a JSON error; counts requests.
async fn answering(status: u16) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = c.read(&mut buf).await;
                let body = r#"{"error":"stand-in"}"#;
                let reply = format!(
                    "HTTP/1.1 {status} Stand-in\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = c.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

/// Runs `ac7 args…` with `AC7_URL=urls` and `AC7_TOKEN=token`, off the async runtime.
async fn ac7(urls: String, token: String, args: &'static [&'static str]) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(common::ac7())
            .args(args)
            .env("AC7_URL", urls)
            .env("AC7_TOKEN", token)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn operator_verbs_move_past_a_dead_url_and_an_unavailable_one() {
    let b = start_broker().await;
    let director = b.tokens["director"].clone();
    let dead = dead_url().await;
    let (unavailable, hits) = answering(503).await;
    let urls = format!("{dead},{unavailable},{}", b.url);
    let (ok, out) = ac7(
        urls.clone(),
        director.clone(),
        &["push", "--to", "builder", "--body", "through the third URL"],
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    let history = b.get("/history?with=builder", "director").await.json;
    let bodies: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["body"].as_str())
        .collect();
    assert_eq!(bodies, ["through the third URL"], "exactly once: {history}");
    // `--url` repeated works the same way.
    let out = tokio::task::spawn_blocking({
        let (dead, live) = (dead.clone(), b.url.clone());
        move || {
            Command::new(common::ac7())
                .args(["roster", "--url", &dead, "--url", &live])
                .env("AC7_TOKEN", director)
                .env_remove("AC7_URL")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("builder"));
}

#[tokio::test]
async fn a_500_is_not_retried_elsewhere() {
    let b = start_broker().await;
    let (failing, hits) = answering(500).await;
    let (ok, out) = ac7(
        format!("{failing},{}", b.url),
        b.tokens["director"].clone(),
        &["push", "--to", "builder", "--body", "maybe done already"],
    )
    .await;
    assert!(!ok, "{out}");
    assert!(out.contains("500") && out.contains("stand-in"), "{out}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    let history = b.get("/history?with=builder", "director").await.json;
    assert_eq!(history["messages"], serde_json::json!([]), "{history}");
}

#[tokio::test]
async fn every_url_down_is_one_clear_error() {
    let (a, b) = (dead_url().await, dead_url().await);
    let (ok, out) = ac7(format!("{a},{b}"), "t".into(), &["roster"]).await;
    assert!(!ok);
    assert!(out.contains("cannot reach the broker"), "{out}");
}
