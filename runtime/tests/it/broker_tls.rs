//! HTTPS: `ac7 serve --tls-cert/--tls-key` with a self-signed certificate made
//! here, reached by reqwest, the live stream, and the real `ac7` operator verbs
//! trusting it through `AC7_CA_CERT`.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use std::time::Duration;

use ac7_runtime::broker::server::TlsFiles;
use broker_support::{self_signed, start_with};
use futures_util::StreamExt;
use serde_json::json;

const AC7: &str = env!("CARGO_BIN_EXE_ac7");

#[tokio::test]
async fn https_serves_the_api_and_the_live_stream() {
    let pki = self_signed();
    let files = pki.files.clone();
    let b = start_with(move |c| c.tls = Some(files)).await;
    let https = format!("https://localhost:{}", b.broker.addr.port());
    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.cert_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let r = trusting
        .get(format!("{https}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // Not trusted without the certificate; plain HTTP on the TLS port gets nowhere.
    let default = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let err = default
        .get(format!("{https}/healthz"))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    assert!(
        default
            .get(format!("http://localhost:{}/healthz", b.broker.addr.port()))
            .send()
            .await
            .is_err()
    );

    // The live stream over TLS.
    let resp = trusting
        .get(format!("{https}/subscribe?name=builder"))
        .bearer_auth(b.token("builder"))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut stream = resp.bytes_stream();
    let pushed = trusting
        .post(format!("{https}/push"))
        .bearer_auth(b.token("director"))
        .json(&json!({"to": "builder", "body": "over tls"}))
        .send()
        .await
        .unwrap();
    assert_eq!(pushed.status().as_u16(), 200);
    let mut text = String::new();
    while !text.contains("over tls") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("no SSE frame over TLS")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }

    // The real operator verbs, trusting the certificate through AC7_CA_CERT.
    let ca = pki.files.cert.clone();
    let token = b.token("director").to_owned();
    let url = https.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(AC7)
            .args(["push", "--body", "from the cli", "--to", "builder"])
            .env("AC7_URL", &url)
            .env("AC7_TOKEN", &token)
            .env("AC7_CA_CERT", &ca)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without it, the same call fails on the certificate.
    let token = b.token("director").to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(AC7)
            .args(["roster"])
            .env("AC7_URL", &https)
            .env("AC7_TOKEN", &token)
            .env_remove("AC7_CA_CERT")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    // One line that names the problem and the fix.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TLS certificate is not trusted") && err.contains("set AC7_CA_CERT"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[tokio::test]
async fn unusable_tls_files_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let err = ac7_runtime::broker::server::tls_acceptor(&TlsFiles {
        cert: bad.clone(),
        key: bad.clone(),
    })
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("holds no PEM certificate"),
        "{err}"
    );
    let pki = self_signed();
    let err = ac7_runtime::broker::server::tls_acceptor(&TlsFiles {
        cert: pki.files.cert.clone(),
        key: bad,
    })
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("holds no PEM private key"),
        "{err}"
    );
}

#[test]
fn serve_refuses_unusable_tls_files_before_creating_anything() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let db = dir.path().join("ac7.db");
    let out = std::process::Command::new(AC7)
        .args([
            "serve",
            "--port",
            "0",
            "--team-name",
            "t",
            "--directive",
            "d",
        ])
        .args(["--member", "boss:lead:admin", "--db"])
        .arg(&db)
        .arg("--tls-cert")
        .arg(&bad)
        .arg("--tls-key")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("holds no PEM certificate"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ac7_"));
    assert!(!db.exists(), "a failed start left a database behind");
}
