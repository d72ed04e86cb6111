//! The shared file space over HTTP: homes, write/read/stat/ls/mkdir/rm/mv,
//! collisions, grants through attachments, size cap, path rejection, blob sharing.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use broker_support::{req, start_broker, start_with};
use serde_json::json;

#[tokio::test]
async fn write_read_stat_ls() {
    let b = start_broker().await;
    let r = b.get("/fs/ls?path=/", "builder").await;
    assert_eq!(r.json["entries"].as_array().unwrap().len(), 1);
    assert_eq!(r.json["entries"][0]["path"], "/builder");
    snap!("fs_ls_root", r.json);
    assert_eq!(
        b.get("/fs/ls?path=/", "director").await.json["entries"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        b.get("/fs/ls?path=/builder", "builder").await.json,
        json!({"entries": []})
    );

    let r = b
        .post("/fs/mkdir", "builder", json!({"path": "/builder/notes"}))
        .await;
    assert_eq!(
        (r.status, r.json["entry"]["kind"].clone()),
        (200, json!("directory"))
    );
    let r = b
        .post(
            "/fs/mkdir",
            "builder",
            json!({"path": "/builder/a/b/c", "recursive": true}),
        )
        .await;
    assert_eq!(r.status, 200);
    let r = b
        .post("/fs/mkdir", "builder", json!({"path": "/builder/x/y"}))
        .await;
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (404, json!("not_found"))
    );
    let r = b
        .post("/fs/mkdir", "builder", json!({"path": "/reviewer/x"}))
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "cannot mkdir /reviewer/x", "code": "forbidden"})
        )
    );

    let body = b"hello from builder";
    let r = b
        .write_file(
            "builder",
            "/builder/notes/hello.txt",
            "text/plain",
            body,
            None,
        )
        .await;
    assert_eq!((r.status, r.json["renamed"].clone()), (200, json!(false)));
    assert_eq!(
        r.json["entry"]["hash"],
        "2f44e76ccdb0b2b3ad83ea19b8dc68124cd7848445e0577a8b3789f9e6d88a29"
    );
    snap!("fs_write", r.json);
    let r = b
        .write_file(
            "builder",
            "/builder/notes/hello.txt",
            "text/plain",
            body,
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            409,
            json!({"error": "already exists: /builder/notes/hello.txt", "code": "exists"})
        )
    );
    let r = b
        .write_file(
            "builder",
            "/builder/notes/hello.txt",
            "text/plain",
            body,
            Some("suffix"),
        )
        .await;
    assert_eq!(
        (r.json["entry"]["path"].clone(), r.json["renamed"].clone()),
        (json!("/builder/notes/hello-1.txt"), json!(true))
    );
    let r = b
        .write_file(
            "builder",
            "/builder/notes/hello.txt",
            "text/plain",
            b"v2",
            Some("overwrite"),
        )
        .await;
    assert_eq!((r.status, r.json["entry"]["size"].clone()), (200, json!(2)));
    let r = b
        .write_file(
            "builder",
            "/builder/notes/hello.txt",
            "text/plain",
            b"v2",
            Some("sideways"),
        )
        .await;
    assert_eq!(r.status, 400);
    let resp = b
        .http
        .post(format!("{}/fs/write?path=/builder/notes/x.txt", b.url))
        .bearer_auth(b.token("builder"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"error": "`mime` query parameter is required"})
    );
    let r = b
        .write_file("builder", "/reviewer/x.txt", "text/plain", b"x", None)
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "cannot write to /reviewer/x.txt", "code": "forbidden"})
        )
    );

    let r = b
        .get("/fs/stat?path=/builder/notes/hello.txt", "builder")
        .await;
    assert_eq!(r.json["entry"]["size"], 2);
    b.check(vec![
        req("GET", "/fs/stat?path=/builder/nope", "builder").answers_at(
            404,
            "/error",
            json!("no such path: /builder/nope"),
        ),
        req("GET", "/fs/stat", "builder")
            .answers_json(400, json!({"error": "`path` query parameter is required"})),
        req("GET", "/fs/stat?path=/builder/notes", "reviewer").answers(403),
    ])
    .await;

    let r = b
        .raw(
            "GET",
            "/fs/read/builder/notes/hello.txt",
            Some("builder"),
            None,
        )
        .await;
    assert_eq!((r.status, r.text.as_str()), (200, "v2"));
    assert_eq!(r.headers["content-type"], "text/plain");
    assert_eq!(
        r.headers["content-disposition"],
        "inline; filename=\"hello.txt\""
    );
    b.check(vec![
        req("GET", "/fs/read/builder/notes/hello.txt", "reviewer").answers_json(
            403,
            json!({"error": "cannot stat /builder/notes/hello.txt", "code": "forbidden"}),
        ),
        req("GET", "/fs/read/builder/notes/missing.txt", "builder").answers_at(
            404,
            "/code",
            json!("not_found"),
        ),
    ])
    .await;

    let r = b.get("/fs/ls?path=/builder/notes", "builder").await;
    let names: Vec<_> = r.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["hello-1.txt", "hello.txt"]);
    assert_eq!(b.get("/fs/ls?path=/builder", "reviewer").await.status, 403);
    let r = b.get("/fs/ls?path=/builder", "builder").await;
    let names: Vec<_> = r.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a", "notes"], "directories first, by name");
}

#[tokio::test]
async fn grants_mv_rm_shared_all() {
    let b = start_broker().await;
    b.write_file(
        "builder",
        "/builder/notes/hello.txt",
        "text/plain",
        b"hello",
        None,
    )
    .await;
    let r = b
        .post(
            "/fs/mv",
            "builder",
            json!({"from": "/builder/notes/hello.txt", "to": "/builder/notes/renamed.txt"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["entry"]["name"].clone()),
        (200, json!("renamed.txt"))
    );
    let r = b
        .post(
            "/fs/mv",
            "builder",
            json!({"from": "/builder/notes/nothere.txt", "to": "/builder/z.txt"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (404, json!("not_found"))
    );
    let r = b
        .post(
            "/fs/mv",
            "builder",
            json!({"from": "/builder/notes", "to": "/builder/n2"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("directory move is not supported yet"))
    );
    let r = b
        .post(
            "/fs/mv",
            "builder",
            json!({"from": "/builder/notes/renamed.txt", "to": "/reviewer/x.txt"}),
        )
        .await;
    assert_eq!(r.status, 403);

    // attaching grants the recipient read access; names and sizes come from the store
    let r = b
        .post(
            "/push",
            "builder",
            json!({"to": "reviewer", "body": "see attached",
                   "attachments": [{"path": "/builder/notes/renamed.txt", "name": "fake", "size": 999, "mimeType": "x/y"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["message"]["attachments"],
        json!([{"path": "/builder/notes/renamed.txt", "name": "renamed.txt", "size": 5, "mimeType": "text/plain"}])
    );
    let r = b.get("/fs/shared", "reviewer").await;
    assert_eq!(r.json["entries"][0]["path"], "/builder/notes/renamed.txt");
    let r = b
        .raw(
            "GET",
            "/fs/read/builder/notes/renamed.txt",
            Some("reviewer"),
            None,
        )
        .await;
    assert_eq!((r.status, r.text.as_str()), (200, "hello"));
    // ... but not write or delete
    let r = b
        .call(
            "DELETE",
            "/fs/rm?path=/builder/notes/renamed.txt",
            "reviewer",
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "cannot remove /builder/notes/renamed.txt", "code": "forbidden"})
        )
    );
    // attachment errors
    let att = |p: &str| json!({"to": "reviewer", "body": "x", "attachments": [{"path": p, "name": "n", "size": 1, "mimeType": "t"}]});
    b.write_file("director", "/director/secret.txt", "text/plain", b"s", None)
        .await;
    let push = |p: &str| req("POST", "/push", "builder").body(att(p));
    b.check(vec![
        push("/builder/none.txt").answers_at(
            400,
            "/error",
            json!("attachment not found: /builder/none.txt"),
        ),
        push("/builder/notes").answers_at(
            400,
            "/error",
            json!("attachment is a directory: /builder/notes"),
        ),
        push("/director/secret.txt").answers_at(
            403,
            "/error",
            json!("no access to attachment: /director/secret.txt"),
        ),
    ])
    .await;

    // all (admin only)
    let r = b.get("/fs/all", "director").await;
    assert_eq!(r.json["entries"].as_array().unwrap().len(), 2);
    let r = b.get("/fs/all", "builder").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "admin permission required to list all files", "code": "forbidden"})
        )
    );

    // rm
    b.post(
        "/fs/mkdir",
        "builder",
        json!({"path": "/builder/a/b", "recursive": true}),
    )
    .await;
    b.write_file("builder", "/builder/a/b/f.txt", "text/plain", b"f", None)
        .await;
    let r = b
        .call("DELETE", "/fs/rm?path=/builder/a", "builder", None)
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            409,
            json!({"error": "directory not empty: /builder/a", "code": "not_empty"})
        )
    );
    assert_eq!(
        b.call(
            "DELETE",
            "/fs/rm?path=/builder/a&recursive=true",
            "builder",
            None
        )
        .await
        .status,
        204
    );
    assert_eq!(
        b.get("/fs/stat?path=/builder/a/b/f.txt", "builder")
            .await
            .status,
        404
    );
    assert_eq!(
        b.call(
            "DELETE",
            "/fs/rm?path=/builder/notes/renamed.txt",
            "builder",
            None
        )
        .await
        .status,
        204
    );
    assert!(
        b.get("/fs/shared", "reviewer").await.json["entries"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        b.call("DELETE", "/fs/rm?path=/builder", "builder", None)
            .await
            .status,
        400
    );
}

#[tokio::test]
async fn bad_paths_are_rejected_with_400() {
    let b = start_broker().await;
    for bad in [
        "/builder/../reviewer/x",
        "//builder/x",
        "/builder/a%00b",
        "/builder/%FF",
        "/builder/./x",
        "builder/x",
    ] {
        let resp = b
            .http
            .post(format!("{}/fs/write?path={bad}&mime=text/plain", b.url))
            .bearer_auth(b.token("builder"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{bad}");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert!(
            v["error"].as_str().unwrap().starts_with("invalid path"),
            "{bad}: {v}"
        );
    }
    // (a `..` in the URL path is resolved by the HTTP client itself, so test NUL and bad UTF-8 there)
    for bad in ["/fs/read/builder/a%00b", "/fs/read/builder/%FF"] {
        assert_eq!(
            b.raw("GET", bad, Some("builder"), None).await.status,
            400,
            "{bad}"
        );
    }
    let r = b.get("/fs/stat?path=/builder//x", "builder").await;
    assert_eq!(r.status, 400);
    let r = b
        .write_file("builder", "/top.txt", "text/plain", b"x", None)
        .await;
    assert_eq!(r.status, 403, "writing directly under / is refused");
    // a trailing slash is normalised away
    let r = b
        .post("/fs/mkdir", "builder", json!({"path": "/builder/dir/"}))
        .await;
    assert_eq!(r.json["entry"]["path"], "/builder/dir");
}

#[tokio::test]
async fn size_cap_is_413_and_nothing_is_written() {
    let b = start_with(|c| c.max_file_bytes = 1000).await;
    let r = b
        .write_file(
            "builder",
            "/builder/ok.bin",
            "application/octet-stream",
            &[7u8; 1000],
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    let r = b
        .write_file(
            "builder",
            "/builder/big.bin",
            "application/octet-stream",
            &[7u8; 1001],
            None,
        )
        .await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json["code"], "too_large");
    assert_eq!(
        b.get("/fs/stat?path=/builder/big.bin", "builder")
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn file_cap_and_json_cap_are_separate() {
    let b = start_with(|c| {
        c.max_json_bytes = 4096;
        c.max_file_bytes = 100_000;
    })
    .await;
    let r = b
        .write_file(
            "builder",
            "/builder/big.bin",
            "application/octet-stream",
            &[1u8; 50_000],
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = b
        .post("/push", "builder", json!({"body": "x".repeat(5000)}))
        .await;
    assert_eq!(r.status, 413);
}

#[tokio::test]
async fn identical_content_is_stored_once_and_purged_with_the_last_entry() {
    let b = start_broker().await;
    let stats = |b: &broker_support::TestBroker| {
        b.broker
            .state
            .store
            .view(ac7_runtime::broker::fs::blob_stats)
            .unwrap()
    };
    b.write_file("builder", "/builder/1.txt", "text/plain", b"same", None)
        .await;
    b.write_file("builder", "/builder/2.txt", "text/plain", b"same", None)
        .await;
    b.write_file("reviewer", "/reviewer/3.txt", "text/plain", b"same", None)
        .await;
    assert_eq!(stats(&b), (1, 3));
    b.call("DELETE", "/fs/rm?path=/builder/1.txt", "builder", None)
        .await;
    b.call("DELETE", "/fs/rm?path=/builder/2.txt", "builder", None)
        .await;
    assert_eq!(stats(&b), (1, 1));
    b.call("DELETE", "/fs/rm?path=/reviewer/3.txt", "reviewer", None)
        .await;
    assert_eq!(stats(&b), (0, 0));
}

#[tokio::test]
async fn active_types_are_sandboxed_attachments() {
    let b = start_broker().await;
    let active = [
        ("page.html", "text/html"),
        ("page.xhtml", "application/xhtml+xml"),
        ("pic.svg", "image/svg+xml"),
        ("doc.xml", "text/xml"),
        ("doc2.xml", "application/xml"),
        ("feed.atom", "application/atom+xml"),
        ("run.js", "text/javascript"),
        ("run2.js", "application/javascript"),
        ("shout.html", "TEXT/HTML; charset=utf-8"),
        ("blob.bin", "application/octet-stream"),
    ];
    let passive = [
        ("a.txt", "text/plain"),
        ("b.png", "image/png"),
        ("c.json", "application/json"),
    ];
    for (name, mime) in active.iter().chain(passive.iter()) {
        let path = format!("/builder/{name}");
        let r = b
            .write_file("builder", &path, mime, b"<script>alert(1)</script>", None)
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let r = b
            .raw("GET", &format!("/fs/read{path}"), Some("builder"), None)
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{name}");
        assert_eq!(
            r.headers["content-security-policy"], "sandbox; default-src 'none'",
            "{name}"
        );
        let want = if passive.iter().any(|(n, _)| n == name) {
            "inline"
        } else {
            "attachment"
        };
        assert_eq!(
            r.headers["content-disposition"],
            format!("{want}; filename=\"{name}\"").as_str(),
            "{mime}"
        );
    }
}

fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                out.extend(files_under(&e.path()));
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

#[tokio::test]
async fn uploads_live_in_the_blob_dir_not_in_the_database() {
    if broker_support::sqlite_only("the blob directory") {
        return;
    }
    let b = start_broker().await;
    let blobs = b.dir.path().join("ac7.db-blobs");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let r = b
        .write_file(
            "builder",
            "/builder/big.bin",
            "application/octet-stream",
            &data,
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let hash = r.json["entry"]["hash"].as_str().unwrap().to_owned();
    let file = blobs.join(&hash[..2]).join(&hash);
    assert_eq!(std::fs::read(&file).unwrap(), data);
    let mode = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    let in_db: i64 = b.broker.state.store.with(|c| {
        c.query_row(
            "SELECT length(data) FROM blobs WHERE hash = ?1",
            [&hash],
            |r| r.get(0),
        )
        .unwrap()
    });
    assert_eq!(in_db, 0, "the bytes are not kept in SQLite");
    let resp = b
        .http
        .get(format!("{}/fs/read/builder/big.bin", b.url))
        .bearer_auth(b.token("builder"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-length"], "300000");
    assert_eq!(resp.bytes().await.unwrap().as_ref(), &data[..]);
    // a second entry shares the file; the file goes with the last entry
    b.write_file(
        "reviewer",
        "/reviewer/same.bin",
        "application/octet-stream",
        &data,
        None,
    )
    .await;
    assert_eq!(files_under(&blobs), vec![file.clone()]);
    b.call("DELETE", "/fs/rm?path=/builder/big.bin", "builder", None)
        .await;
    assert!(file.exists());
    b.call("DELETE", "/fs/rm?path=/reviewer/same.bin", "reviewer", None)
        .await;
    assert!(files_under(&blobs).is_empty(), "{:?}", files_under(&blobs));
    // overwriting drops the old content's file
    b.write_file("builder", "/builder/o.txt", "text/plain", b"one", None)
        .await;
    b.write_file(
        "builder",
        "/builder/o.txt",
        "text/plain",
        b"two",
        Some("overwrite"),
    )
    .await;
    assert_eq!(files_under(&blobs).len(), 1);
}

/// Sends a raw HTTP request head and `body`, then closes without finishing.
async fn cut_off_upload(b: &broker_support::TestBroker, head: &str, body: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let addr = b.url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    tcp.flush().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(tcp);
}

#[tokio::test]
async fn an_upload_cut_off_or_over_the_cap_leaves_nothing() {
    let b = start_with(|c| c.max_file_bytes = 200_000).await;
    let blobs = b.dir.path().join("ac7.db-blobs");
    let token = b.token("builder").to_owned();
    // the client goes away half-way
    let head = format!(
        "POST /fs/write?path=/builder/cut.bin&mime=application/octet-stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: 150000\r\n\r\n"
    );
    cut_off_upload(&b, &head, &[1u8; 70_000]).await;
    // chunked, with no length announced, over the cap
    let resp = b
        .http
        .post(format!(
            "{}/fs/write?path=/builder/big.bin&mime=application/octet-stream",
            b.url
        ))
        .bearer_auth(&token)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            (0..5).map(|_| Ok::<_, std::io::Error>(vec![2u8; 50_000])),
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    crate::common::wait_until_showing(
        "the half-written blobs to be removed",
        std::time::Duration::from_secs(5),
        || format!("left: {:?}", files_under(&blobs)),
        async || files_under(&blobs).is_empty(),
    )
    .await;
    for p in ["/builder/cut.bin", "/builder/big.bin"] {
        let r = b.get(&format!("/fs/stat?path={p}"), "builder").await;
        assert_eq!(r.status, 404, "{p}");
    }
}

#[tokio::test]
async fn file_quota_is_per_member() {
    let b = start_with(|c| c.file_quota_bytes = Some(1000)).await;
    let w = |who: &'static str, path: &'static str, n: usize, collide: Option<&'static str>| {
        let b = &b;
        async move {
            b.write_file(
                who,
                path,
                "application/octet-stream",
                &vec![3u8; n],
                collide,
            )
            .await
        }
    };
    assert_eq!(w("builder", "/builder/a", 600, None).await.status, 200);
    let r = w("builder", "/builder/b", 500, None).await;
    assert_eq!(r.status, 413, "{}", r.text);
    assert_eq!(r.json["code"], "quota_exceeded");
    assert_eq!(r.json["used"], 600);
    assert_eq!(r.json["quota"], 1000);
    assert_eq!(
        b.get("/fs/stat?path=/builder/b", "builder").await.status,
        404
    );
    // replacing a file counts only the difference
    let r = w("builder", "/builder/a", 900, Some("overwrite")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // an admin writing into builder's home is charged to builder
    let r = w("director", "/builder/c", 200, None).await;
    assert_eq!(r.status, 413, "{}", r.text);
    // others have their own quota
    assert_eq!(w("reviewer", "/reviewer/a", 1000, None).await.status, 200);
    // freeing space makes room again
    b.call("DELETE", "/fs/rm?path=/builder/a", "builder", None)
        .await;
    assert_eq!(w("builder", "/builder/b", 500, None).await.status, 200);
}
