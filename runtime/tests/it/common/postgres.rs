//! A fresh PostgreSQL database per test, on the server of `AC7_TEST_POSTGRES`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`, a role that may create databases).
//!
//! [`TestDb::create`] makes `ac7_t_<random hex>` and drops it (`WITH (FORCE)`) when the
//! [`TestDb`] goes. Without a server: under `CI=true` the test fails with the reason; otherwise
//! it prints the reason and `create` returns `None`, and the test returns early (skipped).

use ac7_runtime::broker::pg::{PgConfig, PgPool};

/// The admin URL of the test server.
pub fn admin_url() -> String {
    std::env::var("AC7_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A database that lives as long as this value.
pub struct TestDb {
    /// Its name.
    pub name: String,
    /// Its URL (same server, role and TLS mode as the admin URL).
    pub url: String,
    admin: PgConfig,
}

fn skip(reason: String) -> Option<TestDb> {
    let msg = format!(
        "PostgreSQL for the tests is not available: {reason} (set AC7_TEST_POSTGRES, or start \
         the server as .ci/run does)"
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("\n*** SKIPPED: {msg} ***\n");
    None
}

impl TestDb {
    /// A fresh, empty database (no schema), or `None` (skipped) without a server.
    pub async fn create() -> Option<TestDb> {
        let admin = match PgConfig::parse(&admin_url()) {
            Ok(c) => c,
            Err(e) => return skip(e.to_string()),
        };
        let pool = match PgPool::connect(admin.clone()).await {
            Ok(p) => p,
            Err(e) => return skip(e.to_string()),
        };
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).unwrap();
        let name = format!(
            "ac7_t_{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let client = pool.get().await.unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e:?}"));
        let config = admin.with_dbname(&name);
        let url = url_of(&admin_url(), &name);
        assert_eq!(PgConfig::parse(&url).unwrap(), config);
        Some(TestDb { name, url, admin })
    }

    /// The parsed configuration of [`TestDb::url`].
    pub fn config(&self) -> PgConfig {
        PgConfig::parse(&self.url).unwrap()
    }

    /// A pool on the database.
    pub async fn pool(&self) -> PgPool {
        PgPool::connect(self.config()).await.unwrap()
    }
}

/// `url` with its database replaced by `dbname`.
fn url_of(url: &str, dbname: &str) -> String {
    let (main, query) = match url.split_once('?') {
        Some((m, q)) => (m, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = main.find("://").map_or(0, |i| i + 3);
    let base = match main[scheme_end..].find('/') {
        Some(i) => &main[..scheme_end + i],
        None => main,
    };
    format!("{base}/{dbname}{query}")
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime: drop the database from a thread of its own.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let pool = PgPool::connect(admin).await?;
                let client = pool.get().await?;
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await?;
                Ok::<_, ac7_runtime::broker::pg::PgError>(())
            })
        })
        .join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop the test database {}: {e}", self.name),
            Err(_) => eprintln!("could not drop the test database {}", self.name),
        }
    }
}
