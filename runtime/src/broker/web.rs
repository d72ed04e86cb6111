//! Serving the web app from the broker binary.
//!
//! The app is hand-written ES modules under `runtime/web/`, embedded with
//! `include_bytes!` (no build step, no Node). At first use each file is hashed
//! (SHA-256) and gzip-compressed once; the whole set gets one version, a hash
//! of every file.
//!
//! * `GET /_app/<version>/<file>`: the file, `Cache-Control: public,
//!   max-age=31536000, immutable`. The shell refers to its assets under the
//!   current version, and the modules import each other relatively
//!   (`./core.js`), so a new binary means new URLs and nothing stale is ever
//!   used from a cache.
//! * `GET /_app/<file>` (or an old version): the current file with
//!   `Cache-Control: no-cache`, so it is revalidated. The shell is also
//!   `/_app/<version>/shell.html`, for the service worker's offline cache.
//! * `GET /sw.js` (the service worker; its scope is `/`) and `GET
//!   /manifest.webmanifest`: `no-cache`; they, like the shell, name the assets
//!   under the current version.
//! * Every asset has a strong `ETag` (one per encoding) and answers
//!   `If-None-Match` with 304; it is sent gzip-compressed when the client
//!   accepts `gzip` (`Vary: Accept-Encoding`).
//!
//! **The shell rule.** A `GET`/`HEAD` that is a browser navigation gets the app's
//! HTML shell (`index.html`) whatever the path, including paths that are also
//! API paths such as `/objectives/7` or `/members/ann/activity`: reloading any
//! page of the app lands in the app, never on raw JSON. A request is a
//! navigation when `Sec-Fetch-Mode: navigate` is present, or, without any
//! `Sec-Fetch-Mode`, when its `Accept` rates `text/html` above
//! `application/json` (`*/*` alone is not enough). API clients (`Accept:
//! application/json` or `*/*`, the CLI, the runner, `fetch()` from the app)
//! keep getting JSON. Exceptions, never the shell: `/_app/…` (the assets),
//! `/fs/read/…` (file downloads: opening one in a tab downloads it, sandboxed),
//! `/subscribe` and `…/stream` (event streams), `/healthz`, `/sw.js` (the service worker)
//! and `/manifest.webmanifest` (the web app manifest). Unknown app paths
//! get the shell too; the app's router shows its home for them.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::LazyLock;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::http::ApiError;
use super::tokens::sha256_hex;

/// The embedded files: name, content type, bytes.
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../../web/index.html"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../web/app.css"),
    ),
    ("core.js", JS, include_bytes!("../../web/core.js")),
    ("app.js", JS, include_bytes!("../../web/app.js")),
    ("signin.js", JS, include_bytes!("../../web/signin.js")),
    ("api.js", JS, include_bytes!("../../web/api.js")),
    ("store.js", JS, include_bytes!("../../web/store.js")),
    ("thread.js", JS, include_bytes!("../../web/thread.js")),
    ("chat.js", JS, include_bytes!("../../web/chat.js")),
    ("members.js", JS, include_bytes!("../../web/members.js")),
    (
        "objectives.js",
        JS,
        include_bytes!("../../web/objectives.js"),
    ),
    ("files.js", JS, include_bytes!("../../web/files.js")),
    ("activity.js", JS, include_bytes!("../../web/activity.js")),
    ("push.js", JS, include_bytes!("../../web/push.js")),
    ("sw.js", JS, include_bytes!("../../web/sw.js")),
    (
        "manifest.webmanifest",
        "application/manifest+json",
        include_bytes!("../../web/manifest.webmanifest"),
    ),
    (
        "icon-192.png",
        PNG,
        include_bytes!("../../web/icon-192.png"),
    ),
    (
        "icon-512.png",
        PNG,
        include_bytes!("../../web/icon-512.png"),
    ),
];

const PNG: &str = "image/png";

/// Files that name other files of the app, rewritten to name them under the current version.
const REWRITTEN: [&str; 3] = ["index.html", "sw.js", "manifest.webmanifest"];

const JS: &str = "text/javascript; charset=utf-8";

/// Below this size gzip is not worth a second representation.
const GZIP_MIN: usize = 256;

/// One embedded file, ready to serve.
struct Asset {
    content_type: &'static str,
    raw: axum::body::Bytes,
    gzip: Option<axum::body::Bytes>,
    /// Strong validators, one per representation.
    etag: String,
    etag_gzip: String,
}

impl Asset {
    fn new(content_type: &'static str, bytes: Vec<u8>) -> Asset {
        let hash = sha256_hex(&bytes);
        let tag = &hash[..20];
        let gzip = (bytes.len() >= GZIP_MIN).then(|| gzip(&bytes));
        Asset {
            content_type,
            etag: format!("\"{tag}\""),
            etag_gzip: format!("\"{tag}.gz\""),
            raw: bytes.into(),
            gzip: gzip.map(Into::into),
        }
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

/// The app's files, their version and the shell.
pub(crate) struct WebApp {
    version: String,
    assets: BTreeMap<&'static str, Asset>,
}

static APP: LazyLock<WebApp> = LazyLock::new(|| WebApp::new(FILES));

impl WebApp {
    fn new(files: &[(&'static str, &'static str, &'static [u8])]) -> WebApp {
        let mut all = Vec::new();
        for (name, _, bytes) in files {
            all.extend_from_slice(name.as_bytes());
            all.push(0);
            all.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            all.extend_from_slice(bytes);
        }
        let version = sha256_hex(&all)[..12].to_owned();
        let mut assets = BTreeMap::new();
        for (name, ct, bytes) in files {
            let bytes = if REWRITTEN.contains(name) {
                // The shell, the service worker and the manifest name assets under the
                // current version.
                String::from_utf8_lossy(bytes)
                    .replace("\"/_app/", &format!("\"/_app/{version}/"))
                    .replace("'/_app/", &format!("'/_app/{version}/"))
                    .into_bytes()
            } else {
                bytes.to_vec()
            };
            assets.insert(*name, Asset::new(ct, bytes));
        }
        WebApp { version, assets }
    }

    /// The shared, lazily built app (built at start-up by [`warm`]).
    pub(crate) fn get() -> &'static WebApp {
        &APP
    }

    fn serve(&self, name: &str, immutable: bool, headers: &HeaderMap) -> Option<Response> {
        let asset = self.assets.get(name)?;
        let use_gzip = asset.gzip.is_some() && accepts_gzip(headers);
        let etag = if use_gzip {
            &asset.etag_gzip
        } else {
            &asset.etag
        };
        let cache = if immutable {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        let mut resp = if if_none_match(headers, etag) {
            StatusCode::NOT_MODIFIED.into_response()
        } else if use_gzip {
            let mut r = Response::new(Body::from(asset.gzip.clone().unwrap_or_default()));
            r.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            r
        } else {
            Response::new(Body::from(asset.raw.clone()))
        };
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
        if let Ok(v) = HeaderValue::from_str(etag) {
            h.insert(header::ETAG, v);
        }
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
        h.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        Some(resp)
    }
}

/// Builds (hashes and compresses) the embedded app; called once at start-up so
/// the first browser does not pay for it.
pub(crate) fn warm() {
    LazyLock::force(&APP);
}

/// `GET /_app/{*path}`.
pub(crate) async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    let app = WebApp::get();
    let (immutable, name) = match path.split_once('/') {
        Some((ver, name)) => (ver == app.version, name),
        None => (false, path.as_str()),
    };
    // The shell has its own name here (the service worker caches it for an offline start).
    let name = match name {
        "index.html" | "sw.js" | "manifest.webmanifest" => return not_found(&path),
        "shell.html" => "index.html",
        other => other,
    };
    app.serve(name, immutable, &headers)
        .unwrap_or_else(|| not_found(&path))
}

/// `GET /sw.js`: the service worker, at the root so that its scope is the whole app;
/// revalidated on every check (`no-cache`), so a new binary updates it.
pub(crate) async fn service_worker(headers: HeaderMap) -> Response {
    WebApp::get()
        .serve("sw.js", false, &headers)
        .unwrap_or_else(|| not_found("sw.js"))
}

/// `GET /manifest.webmanifest`: what makes the app installable.
pub(crate) async fn manifest(headers: HeaderMap) -> Response {
    WebApp::get()
        .serve("manifest.webmanifest", false, &headers)
        .unwrap_or_else(|| not_found("manifest.webmanifest"))
}

fn not_found(path: &str) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such file in the web app: /_app/{path}"),
    )
    .into_response()
}

/// The shell rule (module docs) for one request, in the router's outer layer: `Shell` is the
/// answer to a browser navigation; `Varies` marks an API answer whose URL a navigation would
/// have turned into the shell, so caches must key it on the headers that decide.
pub(crate) enum ShellRule {
    Shell(Response),
    Varies,
    Exempt,
}

/// Which [`ShellRule`] applies to a request.
pub(crate) fn shell_rule(method: &Method, path: &str, headers: &HeaderMap) -> ShellRule {
    if !((method == Method::GET || method == Method::HEAD) && shell_path(path)) {
        return ShellRule::Exempt;
    }
    if !is_navigation(headers) {
        return ShellRule::Varies;
    }
    let mut resp = WebApp::get()
        .serve("index.html", false, headers)
        .unwrap_or_else(|| not_found("index.html"));
    add_vary(&mut resp);
    ShellRule::Shell(resp)
}

/// `Vary: Accept, Sec-Fetch-Mode`: the same URL answers JSON or HTML by these headers.
pub(crate) fn add_vary(resp: &mut Response) {
    resp.headers_mut().append(
        header::VARY,
        HeaderValue::from_static("Accept, Sec-Fetch-Mode"),
    );
}

/// Paths a navigation may turn into the shell: all but the exceptions.
fn shell_path(path: &str) -> bool {
    !(path.starts_with("/_app/")
        || path.starts_with("/fs/read/")
        || path == "/subscribe"
        || path == "/healthz"
        || path == "/sw.js"
        || path == "/manifest.webmanifest"
        || path.ends_with("/stream"))
}

/// Is this request a browser navigation (module docs)?
pub(crate) fn is_navigation(headers: &HeaderMap) -> bool {
    if let Some(mode) = headers.get("sec-fetch-mode") {
        return mode.as_bytes().eq_ignore_ascii_case(b"navigate");
    }
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let (mut html, mut json) = (0.0f32, 0.0f32);
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "text/html" | "application/xhtml+xml" => html = html.max(q),
            "application/json" => json = json.max(q),
            _ => {}
        }
    }
    html > 0.0 && html > json
}

/// Does `Accept-Encoding` allow gzip?
fn accepts_gzip(headers: &HeaderMap) -> bool {
    let Some(ae) = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let (mut gzip, mut star) = (None, None);
    for item in ae.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(q),
            "*" => star = Some(q),
            _ => {}
        }
    }
    gzip.or(star).is_some_and(|q| q > 0.0)
}

/// Does `If-None-Match` match this strong tag (weak comparison, as RFC 9110 asks)?
fn if_none_match(headers: &HeaderMap, etag: &str) -> bool {
    let Some(inm) = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    inm.split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The service worker caches every script and style of the app for an offline start.
    #[test]
    fn the_service_worker_caches_the_whole_shell() {
        let sw = String::from_utf8_lossy(include_bytes!("../../web/sw.js"));
        let list = &sw[sw.find("const SHELL = [").unwrap()..];
        let list = &list[..list.find("];").unwrap()];
        for (name, ct, _) in FILES {
            // Scripts and styles, and the icon notifications show.
            let wanted = ((ct.starts_with("text/javascript") || ct.starts_with("text/css"))
                && *name != "sw.js")
                || *name == "icon-192.png";
            assert_eq!(
                list.contains(&format!("'/_app/{name}'")),
                wanted,
                "{name} in the service worker's shell list"
            );
        }
        assert!(list.contains("'/_app/shell.html'"));
    }

    fn hm(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn navigation_detection() {
        let chrome =
            "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8";
        assert!(is_navigation(&hm(&[("accept", chrome)])));
        assert!(is_navigation(&hm(&[
            ("sec-fetch-mode", "navigate"),
            ("accept", "*/*")
        ])));
        // fetch() from the app sends Sec-Fetch-Mode: cors, whatever it accepts.
        assert!(!is_navigation(&hm(&[
            ("sec-fetch-mode", "cors"),
            ("accept", chrome)
        ])));
        assert!(!is_navigation(&hm(&[("accept", "*/*")])));
        assert!(!is_navigation(&hm(&[("accept", "application/json")])));
        assert!(!is_navigation(&hm(&[(
            "accept",
            "application/json, text/html;q=0.5"
        )])));
        assert!(!is_navigation(&hm(&[("accept", "text/html;q=0")])));
        assert!(!is_navigation(&HeaderMap::new()));
    }

    #[test]
    fn gzip_negotiation() {
        assert!(accepts_gzip(&hm(&[(
            "accept-encoding",
            "gzip, deflate, br"
        )])));
        assert!(accepts_gzip(&hm(&[("accept-encoding", "*")])));
        assert!(!accepts_gzip(&hm(&[("accept-encoding", "gzip;q=0, br")])));
        assert!(!accepts_gzip(&hm(&[("accept-encoding", "identity")])));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn the_shell_names_versioned_assets_and_every_module_is_embedded() {
        let app = WebApp::get();
        let shell = String::from_utf8_lossy(&app.assets["index.html"].raw).into_owned();
        assert!(
            shell.contains(&format!("/_app/{}/app.js", app.version)),
            "{shell}"
        );
        assert!(!shell.contains("\"/_app/app.js"));
        // Every relative import in a module names an embedded file.
        for (name, asset) in &app.assets {
            let text = String::from_utf8_lossy(&asset.raw);
            for part in text.split("from './").skip(1) {
                let file = part.split('\'').next().unwrap_or("");
                assert!(
                    app.assets.contains_key(file),
                    "{name} imports missing {file}"
                );
            }
            for part in text.split("import './").skip(1) {
                let file = part.split('\'').next().unwrap_or("");
                assert!(
                    app.assets.contains_key(file),
                    "{name} imports missing {file}"
                );
            }
        }
    }

    #[test]
    fn gzip_round_trips() {
        use std::io::Read;
        let app = WebApp::get();
        let a = &app.assets["core.js"];
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&a.gzip.as_ref().unwrap()[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, a.raw);
        assert!(a.gzip.as_ref().unwrap().len() < a.raw.len() / 2);
    }

    #[test]
    fn etags_match() {
        assert!(if_none_match(
            &hm(&[("if-none-match", "\"a\", \"b\"")]),
            "\"b\""
        ));
        assert!(if_none_match(&hm(&[("if-none-match", "W/\"b\"")]), "\"b\""));
        assert!(if_none_match(&hm(&[("if-none-match", "*")]), "\"b\""));
        assert!(!if_none_match(&hm(&[("if-none-match", "\"a\"")]), "\"b\""));
    }
}
