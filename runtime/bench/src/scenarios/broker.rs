//! Broker scenarios. The broker runs as a child process (this same binary with
//! a hidden argument), so its memory is measured on its own and the clients'
//! work does not count against it. Both share the machine's cores.
//!
//! `AC7_BENCH_SYNC=full` makes the broker child fsync every commit
//! (`synchronous=FULL`) instead of the default `NORMAL`.
//!
//! `AC7_BENCH_POSTGRES=postgres://USER@HOST:PORT/DB` puts the broker on PostgreSQL instead:
//! each broker gets a fresh database (`ac7_bench_<pid>_<n>`) on that server, created through
//! the URL's database and dropped afterwards.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::StreamExt;
use serde_json::json;

use super::{Report, peak_rss_kib, percentile, rss_kib};
use ac7_runtime::broker::bootstrap::bootstrap;
use ac7_runtime::broker::config::{MemberSection, TeamConfig, TeamSection};
use ac7_runtime::broker::db::{Store, SyncMode};
use ac7_runtime::broker::pg::{PgConfig, PgPool};
use ac7_runtime::broker::team::Role;
use ac7_runtime::broker::{BrokerConfig, start};

/// The hidden argument that makes `ac7-bench` run a broker.
pub(crate) const CHILD_ARG: &str = "__broker-child";

const CLIENTS: usize = 16;
const PUSHES_PER_CLIENT: usize = 2_000;
const SUBSCRIBERS: usize = 10;
const DELIVERY_MESSAGES: usize = 2_000;

/// Runs a broker on `args[0]` (a db path, or a PostgreSQL URL) and prints `listening <addr>`.
#[allow(clippy::print_stdout)]
pub(crate) fn child_main(args: &[String]) -> anyhow::Result<i32> {
    let target = args.first().context("db path required")?;
    let postgres = target
        .starts_with("postgres://")
        .then(|| PgConfig::parse(target))
        .transpose()?;
    let db = PathBuf::from(target);
    // As `ac7 serve` does.
    ac7_runtime::sys::give_back_large_buffers();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let mut config = BrokerConfig::new(db);
        config.postgres = postgres;
        if std::env::var("AC7_BENCH_SYNC").is_ok_and(|v| v == "full") {
            config.sync = SyncMode::Full;
        }
        let broker = start(config, listener).await?;
        println!("listening {}", broker.addr);
        broker.wait().await?;
        Ok::<_, anyhow::Error>(0)
    })
}

/// A broker child process with its team tokens; killed and its files (or its PostgreSQL
/// database) removed on drop.
pub(super) struct BrokerChild {
    child: Child,
    pub(super) url: String,
    tokens: Vec<(String, String)>,
    dir: PathBuf,
    pg: Option<BenchDb>,
}

/// Starts this binary as a broker child on `target` (a db path or a PostgreSQL URL); the child
/// and its URL once it printed its listening line.
fn spawn_child(target: &str) -> anyhow::Result<(Child, String)> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg(CHILD_ARG)
        .arg(target)
        .env("AC7_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().context("no child stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix("listening ") else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("broker child did not start: {line:?}");
    };
    Ok((child, format!("http://{addr}")))
}

/// A database of its own on the `AC7_BENCH_POSTGRES` server, dropped on drop.
pub(super) struct BenchDb {
    admin: String,
    name: String,
    pub(super) url: String,
}

impl BenchDb {
    pub(super) fn create(admin: &str) -> anyhow::Result<BenchDb> {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "ac7_bench_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        psql(admin, &format!("CREATE DATABASE {name}"))?;
        let (base, _) = admin.split_once('?').map_or((admin, ""), |(b, q)| (b, q));
        let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
        Ok(BenchDb {
            admin: admin.to_owned(),
            url: format!("{base}/{name}"),
            name,
        })
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        let _ = psql(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// Runs one statement on the server of `url` (through the broker's own PostgreSQL pool).
fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let config = PgConfig::parse(url)?;
    let sql = sql.to_owned();
    rt()?.block_on(async move {
        let pool = PgPool::connect(config).await?;
        pool.get().await?.batch_execute(&sql).await?;
        Ok(())
    })
}

impl BrokerChild {
    pub(super) fn spawn(members: usize) -> anyhow::Result<BrokerChild> {
        Self::spawn_with(members, |_| Ok(()))
    }

    /// [`BrokerChild::spawn`], with `seed` run on the store before the broker starts.
    pub(super) fn spawn_with(
        members: usize,
        seed: impl FnOnce(&Store) -> anyhow::Result<()>,
    ) -> anyhow::Result<BrokerChild> {
        let dir = std::env::temp_dir().join(format!(
            "ac7-bench-{}-{}",
            std::process::id(),
            ac7_runtime::broker::now_ms()
        ));
        std::fs::create_dir_all(&dir)?;
        let db = dir.join("bench.db");
        let pg = std::env::var("AC7_BENCH_POSTGRES")
            .ok()
            .map(|admin| BenchDb::create(&admin))
            .transpose()?;
        let config = bench_team("Measure the broker.", members);
        let tokens = {
            let store = match &pg {
                Some(pg) => Store::open_postgres(PgConfig::parse(&pg.url)?)?,
                None => Store::open(&db, SyncMode::Normal)?,
            };
            let tokens = bootstrap(&store, &config)?
                .into_iter()
                .map(|t| (t.name, t.token))
                .collect();
            seed(&store)?;
            tokens
        };
        let target = pg
            .as_ref()
            .map_or_else(|| db.display().to_string(), |pg| pg.url.clone());
        let (child, url) = spawn_child(&target)?;
        Ok(BrokerChild {
            url,
            child,
            tokens,
            dir,
            pg,
        })
    }

    /// Another broker process on this one's PostgreSQL database (a replica); `None` on SQLite.
    pub(super) fn replica(&self) -> anyhow::Result<Option<BrokerChild>> {
        let Some(pg) = &self.pg else {
            return Ok(None);
        };
        let (child, url) = spawn_child(&pg.url)?;
        Ok(Some(BrokerChild {
            url,
            child,
            tokens: self.tokens.clone(),
            dir: self.dir.join("replica"),
            pg: None,
        }))
    }

    pub(super) fn token(&self, name: &str) -> &str {
        self.tokens
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, t)| t)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BrokerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(64)
        .build()?)
}

pub(super) fn rt() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// `CLIENTS` tasks each pushing `per_client` DMs; returns (elapsed, sorted ack latencies in µs).
async fn push_load(b: &BrokerChild, per_client: usize) -> anyhow::Result<(Duration, Vec<u64>)> {
    push_load_over(&[b], b.token("director"), per_client).await
}

/// [`push_load`] with client `c` pushing to `brokers[c % brokers.len()]`, as `token`.
async fn push_load_over(
    brokers: &[&BrokerChild],
    token: &str,
    per_client: usize,
) -> anyhow::Result<(Duration, Vec<u64>)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let http = client()?;
        let url = format!("{}/push", brokers[c % brokers.len()].url);
        let token = token.to_owned();
        let to = format!("m{}", c % 10);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let t = Instant::now();
                let r = http
                    .post(&url)
                    .bearer_auth(&token)
                    .json(&json!({"to": to, "body": format!("client {c} message {i}")}))
                    .send()
                    .await?;
                let status = r.status();
                let body = r.bytes().await?;
                if !status.is_success() {
                    bail!("push failed: {status}: {}", String::from_utf8_lossy(&body));
                }
                lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed();
    all.sort_unstable();
    Ok((elapsed, all))
}

/// Durable push throughput with 16 concurrent clients.
pub(crate) fn push() -> anyhow::Result<Report> {
    let b = BrokerChild::spawn(10)?;
    let (elapsed, lat) = rt()?.block_on(async {
        push_load(&b, 100).await?; // warm-up
        push_load(&b, PUSHES_PER_CLIENT).await
    })?;
    let total = CLIENTS * PUSHES_PER_CLIENT;
    let mut r = Report::new();
    r.insert("scenario", json!("broker-push"));
    r.insert("clients", json!(CLIENTS));
    r.insert("pushes", json!(total));
    r.insert(
        "pushes_per_sec",
        json!((total as f64 / elapsed.as_secs_f64()).round()),
    );
    r.insert("ack_p50_us", json!(percentile(&lat, 50.0)));
    r.insert("ack_p99_us", json!(percentile(&lat, 99.0)));
    r.insert("broker_peak_rss_kib", json!(peak_rss_kib(b.pid())));
    let sync = if std::env::var("AC7_BENCH_SYNC").is_ok_and(|v| v == "full") {
        "FULL"
    } else {
        "NORMAL"
    };
    let durability = if b.pg.is_some() {
        "each push committed to PostgreSQL before its 200".to_owned()
    } else {
        format!("each push committed to SQLite (WAL, synchronous={sync}) before its 200")
    };
    r.insert("durability", json!(durability));
    Ok(r)
}

/// Opens an SSE subscription and calls `on_message(data)` for each message event.
pub(super) async fn sse_loop(
    http: reqwest::Client,
    url: String,
    token: String,
    ready: Arc<AtomicU64>,
    mut on_message: impl FnMut(&str) -> bool + Send + 'static,
) -> anyhow::Result<()> {
    let resp = http
        .get(url)
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("subscribe failed: {}", resp.status());
    }
    ready.fetch_add(1, Ordering::SeqCst);
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(i) = buf.find("\n\n") {
            let block: String = buf.drain(..i + 2).collect();
            if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: "))
                && !on_message(data)
            {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Up to `n` latency samples from `rx` (waiting at most 30 s), sorted.
pub(super) async fn collect_samples(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<u64>,
    n: usize,
) -> Vec<u64> {
    let mut samples = Vec::with_capacity(n);
    let deadline = tokio::time::sleep(Duration::from_secs(30));
    tokio::pin!(deadline);
    while samples.len() < n {
        tokio::select! {
            s = rx.recv() => match s { Some(s) => samples.push(s), None => break },
            () = &mut deadline => break,
        }
    }
    samples.sort_unstable();
    samples
}

/// Replicas on one PostgreSQL database (`AC7_BENCH_POSTGRES` required): durable pushes/s
/// with 16 clients spread over 3 replicas; push on replica A -> SSE delivery on replica B
/// (p50/p99, one push at a time); peak RSS per replica; doorbells (NOTIFYs) per second, one
/// per message.
pub(crate) fn replicas() -> anyhow::Result<Report> {
    if std::env::var("AC7_BENCH_POSTGRES").is_err() {
        bail!("broker-replicas needs AC7_BENCH_POSTGRES=postgres://USER@HOST:PORT/DB");
    }
    let a = BrokerChild::spawn(10)?;
    let b = a.replica()?.context("a replica")?;
    let c = a.replica()?.context("a replica")?;
    let (elapsed, lat, delivery) = rt()?.block_on(async {
        // Throughput: the push load spread over the three replicas.
        let (elapsed, lat) =
            push_load_over(&[&a, &b, &c], a.token("director"), PUSHES_PER_CLIENT / 4).await?;
        // Cross-replica delivery: push on A, subscriber on B.
        let ready = Arc::new(AtomicU64::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
        let sub = tokio::spawn(sse_loop(
            client()?,
            format!("{}/subscribe?name=m0", b.url),
            a.token("m0").to_owned(),
            Arc::clone(&ready),
            move |_| tx.send(Instant::now()).is_ok(),
        ));
        while ready.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let http = client()?;
        let mut delivery = Vec::with_capacity(500);
        for i in 0..500 {
            let t = Instant::now();
            http.post(format!("{}/push", a.url))
                .bearer_auth(a.token("director"))
                .json(&json!({"to": "m0", "body": format!("cross {i}")}))
                .send()
                .await?
                .bytes()
                .await?;
            let at = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await?
                .context("the subscriber on B stopped")?;
            delivery.push(u64::try_from(at.duration_since(t).as_micros()).unwrap_or(u64::MAX));
        }
        sub.abort();
        delivery.sort_unstable();
        Ok::<_, anyhow::Error>((elapsed, lat, delivery))
    })?;
    let total = CLIENTS * (PUSHES_PER_CLIENT / 4);
    let per_sec = (total as f64 / elapsed.as_secs_f64()).round();
    let mut r = Report::new();
    r.insert("scenario", json!("broker-replicas"));
    r.insert("replicas", json!(3));
    r.insert("clients", json!(CLIENTS));
    r.insert("pushes", json!(total));
    r.insert("pushes_per_sec", json!(per_sec));
    r.insert("notifies_per_sec", json!(per_sec));
    r.insert("ack_p50_us", json!(percentile(&lat, 50.0)));
    r.insert("ack_p99_us", json!(percentile(&lat, 99.0)));
    r.insert(
        "cross_replica_delivery_p50_us",
        json!(percentile(&delivery, 50.0)),
    );
    r.insert(
        "cross_replica_delivery_p99_us",
        json!(percentile(&delivery, 99.0)),
    );
    r.insert(
        "replica_peak_rss_kib",
        json!([
            peak_rss_kib(a.pid()),
            peak_rss_kib(b.pid()),
            peak_rss_kib(c.pid())
        ]),
    );
    Ok(r)
}

/// Push -> SSE delivery latency to 10 subscribers.
pub(crate) fn delivery() -> anyhow::Result<Report> {
    let b = BrokerChild::spawn(SUBSCRIBERS)?;
    let (samples, baseline, alone) = rt()?.block_on(async {
        // Baseline: one client pushing alone, nobody subscribed (the push path by itself).
        let mut alone = Vec::with_capacity(500);
        {
            let http = client()?;
            for i in 0..500 {
                let t = Instant::now();
                http.post(format!("{}/push", b.url))
                    .bearer_auth(b.token("director"))
                    .json(&json!({"body": format!("warm {i}")}))
                    .send()
                    .await?
                    .bytes()
                    .await?;
                alone.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            alone.sort_unstable();
        }
        let sent: Arc<Vec<AtomicU64>> =
            Arc::new((0..DELIVERY_MESSAGES).map(|_| AtomicU64::new(0)).collect());
        let origin = Instant::now();
        let ready = Arc::new(AtomicU64::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let mut subs = Vec::new();
        for i in 0..SUBSCRIBERS {
            let name = format!("m{i}");
            let url = format!("{}/subscribe?name={name}", b.url);
            let (sent, tx) = (Arc::clone(&sent), tx.clone());
            let mut seen = 0;
            subs.push(tokio::spawn(sse_loop(
                client()?,
                url,
                b.token(&name).to_owned(),
                Arc::clone(&ready),
                move |data| {
                    let now = origin.elapsed().as_micros() as u64;
                    let seq = seq_of(data);
                    if let Some(seq) = seq
                        && let Some(at) = sent.get(seq as usize)
                    {
                        let _ = tx.send(now.saturating_sub(at.load(Ordering::SeqCst)));
                        seen += 1;
                    }
                    seen < DELIVERY_MESSAGES
                },
            )));
        }
        drop(tx);
        while ready.load(Ordering::SeqCst) < SUBSCRIBERS as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let http = client()?;
        // Baseline: a bare HTTP round trip (GET /healthz) on this machine, same client.
        let mut baseline = Vec::with_capacity(500);
        for _ in 0..500 {
            let t = Instant::now();
            http.get(format!("{}/healthz", b.url))
                .send()
                .await?
                .bytes()
                .await?;
            baseline.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
        }
        baseline.sort_unstable();
        let url = format!("{}/push", b.url);
        for seq in 0..DELIVERY_MESSAGES {
            let body = serde_json::to_vec(&json!({"body": "tick", "data": {"seq": seq}}))?;
            sent[seq].store(origin.elapsed().as_micros() as u64, Ordering::SeqCst);
            let r = http
                .post(&url)
                .bearer_auth(b.token("director"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            r.bytes().await?;
            // Space the pushes out so each one is measured on its own, not queued behind the last.
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let samples = collect_samples(&mut rx, SUBSCRIBERS * DELIVERY_MESSAGES).await;
        for s in subs {
            s.abort();
        }
        Ok::<_, anyhow::Error>((samples, baseline, alone))
    })?;
    let mut r = Report::new();
    r.insert("scenario", json!("broker-delivery"));
    r.insert("subscribers", json!(SUBSCRIBERS));
    r.insert("messages", json!(DELIVERY_MESSAGES));
    r.insert("deliveries", json!(samples.len()));
    r.insert("delivery_p50_us", json!(percentile(&samples, 50.0)));
    r.insert("delivery_p99_us", json!(percentile(&samples, 99.0)));
    r.insert("http_roundtrip_p50_us", json!(percentile(&baseline, 50.0)));
    r.insert("push_alone_ack_p50_us", json!(percentile(&alone, 50.0)));
    r.insert("broker_peak_rss_kib", json!(peak_rss_kib(b.pid())));
    Ok(r)
}

/// Idle RSS after start, and peak RSS under push load with 10 live subscribers.
pub(crate) fn rss() -> anyhow::Result<Report> {
    let b = BrokerChild::spawn(SUBSCRIBERS)?;
    std::thread::sleep(Duration::from_millis(1_000));
    let idle_rss = rss_kib(b.pid());
    let idle_peak = peak_rss_kib(b.pid());
    let elapsed = rt()?.block_on(async {
        let ready = Arc::new(AtomicU64::new(0));
        let mut subs = Vec::new();
        for i in 0..SUBSCRIBERS {
            let name = format!("m{i}");
            let url = format!("{}/subscribe?name={name}", b.url);
            subs.push(tokio::spawn(sse_loop(
                client()?,
                url,
                b.token(&name).to_owned(),
                Arc::clone(&ready),
                |_| true,
            )));
        }
        while ready.load(Ordering::SeqCst) < SUBSCRIBERS as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (elapsed, _) = push_load(&b, PUSHES_PER_CLIENT).await?;
        for s in subs {
            s.abort();
        }
        Ok::<_, anyhow::Error>(elapsed)
    })?;
    let mut r = Report::new();
    r.insert("scenario", json!("broker-rss"));
    r.insert("idle_rss_kib", json!(idle_rss));
    r.insert("idle_peak_rss_kib", json!(idle_peak));
    r.insert("loaded_peak_rss_kib", json!(peak_rss_kib(b.pid())));
    r.insert("loaded_pushes", json!(CLIENTS * PUSHES_PER_CLIENT));
    r.insert("loaded_seconds", json!(elapsed.as_secs_f64()));
    r.insert(
        "bench_client_peak_rss_kib",
        json!(peak_rss_kib(std::process::id())),
    );
    Ok(r)
}

const UPLOADS: usize = 8;
const UPLOAD_BYTES: usize = 24 * 1024 * 1024;

/// Broker RSS while eight members each upload a 24 MB file at once (uploads are
/// streamed to disk, so the peak should stay near idle).
pub(crate) fn upload() -> anyhow::Result<Report> {
    let b = BrokerChild::spawn(UPLOADS)?;
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = rss_kib(b.pid());
    let data = bytes_of(UPLOAD_BYTES);
    let elapsed = rt()?.block_on(async {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..UPLOADS {
            let (http, data) = (client()?, data.clone());
            let url = format!(
                "{}/fs/write?path=/m{i}/upload.bin&mime=application/octet-stream",
                b.url
            );
            let token = b.token(&format!("m{i}")).to_owned();
            tasks.push(tokio::spawn(async move {
                let r = http.post(url).bearer_auth(token).body(data).send().await?;
                if !r.status().is_success() {
                    bail!("upload failed: {}", r.status());
                }
                Ok::<_, anyhow::Error>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok::<_, anyhow::Error>(started.elapsed())
    })?;
    let peak = peak_rss_kib(b.pid());
    let mut r = Report::new();
    r.insert("scenario", json!("broker-upload"));
    r.insert("uploads", json!(UPLOADS));
    r.insert("upload_bytes", json!(UPLOAD_BYTES));
    r.insert("idle_rss_kib", json!(idle_rss));
    r.insert("peak_rss_kib", json!(peak));
    r.insert("seconds", json!(elapsed.as_secs_f64()));
    r.insert(
        "throughput_mib_s",
        json!((UPLOADS * UPLOAD_BYTES) as f64 / 1_048_576.0 / elapsed.as_secs_f64()),
    );
    Ok(r)
}

/// `n` bytes of a fixed, incompressible-looking pattern.
fn bytes_of(n: usize) -> axum::body::Bytes {
    let mut x: u32 = 0x9e37_79b9;
    let v: Vec<u8> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x.to_le_bytes()[0]
        })
        .collect();
    axum::body::Bytes::from(v)
}

/// The `data.seq` number of a delivered message, read without parsing the whole
/// JSON (the measuring client should cost as little as possible).
pub(super) fn seq_of(json: &str) -> Option<u64> {
    let rest = &json[json.find("\"seq\":")? + 6..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The benchmarks' team: `director` (an admin) and `m0`…`m{members-1}` (agents).
pub(crate) fn bench_team(directive: &str, members: usize) -> TeamConfig {
    let member = |name: String, title: &str, permissions: Vec<String>| MemberSection {
        name,
        role: Role {
            title: title.into(),
            description: String::new(),
        },
        instructions: String::new(),
        permissions,
    };
    let mut all = vec![member("director".into(), "director", vec!["admin".into()])];
    all.extend((0..members).map(|i| member(format!("m{i}"), "agent", Vec::new())));
    TeamConfig {
        team: TeamSection {
            name: "bench".into(),
            directive: directive.into(),
            context: String::new(),
            permission_presets: Default::default(),
        },
        members: all,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn seq_is_read_from_the_message_json() {
        assert_eq!(
            super::seq_of(r#"{"id":"x","data":{"seq":42},"attachments":[]}"#),
            Some(42)
        );
        assert_eq!(super::seq_of(r#"{"data":{}}"#), None);
    }
}
