//! The web app served by a real broker: the shell for browser navigations on every
//! path (API paths included), JSON for API clients, the embedded assets with
//! versioned URLs, strong ETags, long caching and gzip (broker/web.rs).

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::io::Read;

use crate::broker_support::{TestBroker, start_broker};

const CHROME_ACCEPT: &str =
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8";

async fn get(b: &TestBroker, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = b.http.get(format!("{}{path}", b.url));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test]
async fn a_browser_reload_on_any_route_gets_the_shell_and_api_clients_get_json() {
    let b = start_broker().await;
    let nav = [("accept", CHROME_ACCEPT), ("sec-fetch-mode", "navigate")];
    for path in [
        "/",
        "/inbox",
        "/objectives",
        "/objectives/new",
        "/objectives/7",
        "/files/director/notes",
        "/members",
        "/members/director/activity",
        "/@director",
        "/c/general",
        "/dm/director",
        "/channels",
        "/briefing",
        "/no/such/page",
    ] {
        // With Sec-Fetch-Mode (browsers) and without it (older clients), no cookie or token.
        for headers in [&nav[..], &nav[..1]] {
            let r = get(&b, path, headers).await;
            assert_eq!(r.status(), 200, "{path}");
            assert_eq!(
                header(&r, "content-type"),
                "text/html; charset=utf-8",
                "{path}"
            );
            assert!(header(&r, "vary").contains("Accept"), "{path}");
            let body = r.text().await.unwrap();
            assert!(body.contains("<div id=\"app\">"), "{path}: {body}");
        }
    }

    // API clients keep getting JSON from the same URLs.
    let token = b.token("director").to_owned();
    for accept in [
        "application/json",
        "*/*",
        "application/json, text/html;q=0.5",
    ] {
        let r = get(
            &b,
            "/objectives",
            &[
                ("accept", accept),
                ("authorization", &format!("Bearer {token}")),
            ],
        )
        .await;
        assert_eq!(r.status(), 200);
        assert!(header(&r, "content-type").starts_with("application/json"));
        assert!(header(&r, "vary").contains("Accept"));
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["objectives"].is_array(), "{v}");
    }
    // No Accept at all (the CLI, the runner): JSON, and auth still applies.
    let r = get(&b, "/objectives/7", &[]).await;
    assert_eq!(r.status(), 401);
    // fetch() from the app: Sec-Fetch-Mode cors wins over an html-ish Accept.
    let r = get(
        &b,
        "/briefing",
        &[("accept", CHROME_ACCEPT), ("sec-fetch-mode", "cors")],
    )
    .await;
    assert_eq!(r.status(), 401);
    assert!(header(&r, "content-type").starts_with("application/json"));

    // The exceptions: downloads, streams, health never turn into the shell.
    for path in [
        "/fs/read/director/x.txt",
        "/subscribe",
        "/healthz",
        "/members/director/activity/stream",
    ] {
        let r = get(&b, path, &nav).await;
        assert_ne!(
            header(&r, "content-type"),
            "text/html; charset=utf-8",
            "{path}"
        );
    }
    // A state-changing request is never answered with the shell.
    let r = b
        .http
        .post(format!("{}/objectives", b.url))
        .header("accept", CHROME_ACCEPT)
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn assets_are_versioned_cached_compressed_and_revalidated() {
    let b = start_broker().await;
    let shell = get(&b, "/", &[("accept", CHROME_ACCEPT)])
        .await
        .text()
        .await
        .unwrap();
    let start = shell.find("/_app/").unwrap();
    let rest = &shell[start + "/_app/".len()..];
    let version = rest.split('/').next().unwrap().to_owned();
    assert_eq!(version.len(), 12, "{shell}");
    assert!(
        shell.contains(&format!("src=\"/_app/{version}/app.js\"")),
        "{shell}"
    );

    // Versioned: immutable for a year; gzip when accepted; a strong ETag per encoding.
    let path = format!("/_app/{version}/core.js");
    let r = get(&b, &path, &[("accept-encoding", "gzip, br")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/javascript; charset=utf-8");
    assert_eq!(
        header(&r, "cache-control"),
        "public, max-age=31536000, immutable"
    );
    assert_eq!(header(&r, "content-encoding"), "gzip");
    assert!(header(&r, "vary").contains("Accept-Encoding"));
    let etag_gz = header(&r, "etag");
    assert!(
        etag_gz.starts_with('"') && !etag_gz.starts_with("W/"),
        "{etag_gz}"
    );
    let gz = r.bytes().await.unwrap();
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut plain)
        .unwrap();

    let r = get(&b, &path, &[]).await;
    assert_eq!(header(&r, "content-encoding"), "");
    let etag = header(&r, "etag");
    assert_ne!(etag, etag_gz);
    let raw = r.bytes().await.unwrap();
    assert_eq!(plain, raw);
    assert!(String::from_utf8_lossy(&raw).contains("export function route"));

    // Revalidation: 304 with no body.
    let r = get(&b, &path, &[("if-none-match", &etag)]).await;
    assert_eq!(r.status(), 304);
    let r = get(
        &b,
        &path,
        &[("if-none-match", &etag_gz), ("accept-encoding", "gzip")],
    )
    .await;
    assert_eq!(r.status(), 304);
    let r = get(&b, &path, &[("if-none-match", "\"stale\"")]).await;
    assert_eq!(r.status(), 200);

    // Unversioned (or an old version): the current file, revalidated every time.
    for path in [
        "/_app/core.js".to_owned(),
        "/_app/000000000000/core.js".to_owned(),
    ] {
        let r = get(&b, &path, &[]).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "cache-control"), "no-cache");
        assert_eq!(r.bytes().await.unwrap(), raw);
    }
    // The shell itself is never cached for long: a new binary must reach browsers.
    let r = get(&b, "/objectives", &[("accept", CHROME_ACCEPT)]).await;
    assert_eq!(header(&r, "cache-control"), "no-cache");

    // Every module the shell and the app import is served.
    for file in [
        "app.css",
        "app.js",
        "signin.js",
        "chat.js",
        "members.js",
        "objectives.js",
        "files.js",
        "activity.js",
    ] {
        let r = get(&b, &format!("/_app/{version}/{file}"), &[]).await;
        assert_eq!(r.status(), 200, "{file}");
    }
    let r = get(&b, "/_app/nope.js", &[]).await;
    assert_eq!(r.status(), 404);
    assert!(header(&r, "content-type").starts_with("application/json"));
}
