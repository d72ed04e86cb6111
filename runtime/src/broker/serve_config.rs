//! `ac7 serve --config FILE` (or `AC7_CONFIG`): the serve flags from a TOML file.
//!
//! The keys are the flags' long names (`port = 8717`, `db = "/var/lib/ac7/ac7.db"`,
//! `trust-proxy = true`, `member = ["director:lead:admin", "builder"]`), at the top level of
//! the file. A value from the file applies only where neither the command line nor the flag's
//! environment variable gave one: flags > environment > file > defaults. Each value goes
//! through the flag's own parser, so the file accepts exactly what the flag does; a key that
//! is not a flag, a table, or a value the flag refuses is an error naming the file, the line
//! and the key.

use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;

/// The name of the flag that points at the file.
pub const CONFIG_FLAG: &str = "config";

/// The argument list of `ac7 serve …` with the file's values appended for every flag that
/// neither the command line nor the environment set; `Ok(None)` when there is no file.
///
/// `serve` is the matched `serve` subcommand of `ac7`'s command line, `serve_cmd` its clap
/// definition, `argv` the whole command line.
pub fn with_file_values(
    serve_cmd: &clap::Command,
    serve: &clap::ArgMatches,
    argv: &[OsString],
) -> Result<Option<Vec<OsString>>, String> {
    let Some(path) = serve.get_one::<std::path::PathBuf>(CONFIG_FLAG) else {
        return Ok(None);
    };
    let extra = file_args(serve_cmd, path, |id| {
        matches!(
            serve.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    })?;
    let mut argv = argv.to_vec();
    argv.extend(extra.into_iter().map(OsString::from));
    Ok(Some(argv))
}

/// The line (1-based) of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(0, |before| before.matches('\n').count())
        + 1
}

/// The `--flag=value` arguments the file at `path` gives, skipping the flags `given` says are
/// set already.
fn file_args(
    serve_cmd: &clap::Command,
    path: &Path,
    given: impl Fn(&str) -> bool,
) -> Result<Vec<String>, String> {
    let shown = path.display();
    let raw = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the config file {shown}: {e}"))?;
    parse_args(serve_cmd, &raw, &shown.to_string(), given)
}

/// [`file_args`] on the file's text; `name` is the file as errors name it.
fn parse_args(
    serve_cmd: &clap::Command,
    raw: &str,
    name: &str,
    given: impl Fn(&str) -> bool,
) -> Result<Vec<String>, String> {
    let doc = toml_edit::Document::parse(raw)
        .map_err(|e| format!("{name} is not valid TOML: {}", e.to_string().trim()))?;
    let keys: Vec<&str> = serve_cmd
        .get_arguments()
        .filter_map(clap::Arg::get_long)
        .filter(|long| !matches!(*long, CONFIG_FLAG | "help"))
        .collect();
    let mut out = Vec::new();
    for (key, item) in doc.as_table().iter() {
        let line = doc
            .as_table()
            .key(key)
            .and_then(toml_edit::Key::span)
            .or_else(|| item.span())
            .map_or(0, |span| line_of(raw, span.start));
        let at = format!("{name}:{line}");
        let Some(arg) = serve_cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key) && keys.contains(&key))
        else {
            let hint = keys
                .iter()
                .find(|k| k.replace('-', "_") == key.replace('-', "_"))
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            return Err(format!(
                "{at}: unknown key `{key}`{hint}: the keys are `ac7 serve`'s flags without the \
                 dashes in front ({})",
                keys.join(", ")
            ));
        };
        if given(arg.get_id().as_str()) {
            continue;
        }
        let Some(value) = item.as_value() else {
            return Err(format!(
                "{at}: `{key}` must be a value (`{key} = …`), not a table"
            ));
        };
        let flag = matches!(
            arg.get_action(),
            clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
        );
        let values: Vec<String> = match value {
            toml_edit::Value::Boolean(b) if flag => {
                if *b.value() {
                    out.push(format!("--{key}"));
                }
                continue;
            }
            _ if flag => {
                return Err(format!("{at}: `{key}` is a switch: true or false"));
            }
            toml_edit::Value::Array(items)
                if matches!(arg.get_action(), clap::ArgAction::Append) =>
            {
                items
                    .iter()
                    .map(scalar)
                    .collect::<Option<_>>()
                    .ok_or_else(|| format!("{at}: `{key}` must be a list of strings or numbers"))?
            }
            other => vec![
                scalar(other)
                    .ok_or_else(|| format!("{at}: `{key}` must be a string or a number"))?,
            ],
        };
        for value in values {
            // The flag's own parser, alone, so a bad value is reported at its line (what
            // it needs besides, like --directive for --team-name, is checked with the rest).
            let probe = format!("--{key}={value}");
            if let Err(e) = serve_cmd
                .clone()
                .no_binary_name(true)
                .try_get_matches_from([probe.as_str()])
                && matches!(
                    e.kind(),
                    clap::error::ErrorKind::InvalidValue | clap::error::ErrorKind::ValueValidation
                )
            {
                let first = e.to_string();
                let first = first
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                return Err(format!("{at}: {key}: {first}"));
            }
            out.push(probe);
        }
    }
    Ok(out)
}

/// A TOML string, integer or float as the text a flag takes.
fn scalar(value: &toml_edit::Value) -> Option<String> {
    match value {
        toml_edit::Value::String(s) => Some(s.value().clone()),
        toml_edit::Value::Integer(i) => Some(i.value().to_string()),
        toml_edit::Value::Float(f) => Some(f.value().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    /// `ac7 serve`'s flags as clap sees them, from the broker's own argument type.
    fn serve() -> clap::Command {
        let mut cmd = <crate::broker::cli::ServeArgs as clap::Args>::augment_args(
            clap::Command::new("serve"),
        );
        cmd.build();
        cmd
    }

    #[test]
    fn keys_become_flags_unless_given() {
        let text = "# the broker\nport = 9000\nhost = \"0.0.0.0\"\ntrust-proxy = true\nmember = [\"a:lead:admin\", \"b\"]\nsync = \"full\"\n";
        let args = parse_args(&serve(), text, "ac7.toml", |_| false).expect("parses");
        assert_eq!(
            args,
            [
                "--port=9000",
                "--host=0.0.0.0",
                "--trust-proxy",
                "--member=a:lead:admin",
                "--member=b",
                "--sync=full"
            ]
        );
        let args = parse_args(&serve(), text, "ac7.toml", |id| id == "port").expect("parses");
        assert!(!args.iter().any(|a| a.starts_with("--port")), "{args:?}");
        let args = parse_args(&serve(), "trust-proxy = false\n", "f", |_| false).expect("parses");
        assert!(args.is_empty());
    }

    #[test]
    fn mistakes_name_the_file_line_and_key() {
        let err = parse_args(
            &serve(),
            "port = 1\n\ncolour = \"red\"\n",
            "ac7.toml",
            |_| false,
        )
        .expect_err("unknown key");
        assert!(err.starts_with("ac7.toml:3: unknown key `colour`"), "{err}");
        let err =
            parse_args(&serve(), "max_file_bytes = 5\n", "f", |_| false).expect_err("underscores");
        assert!(err.contains("did you mean `max-file-bytes`?"), "{err}");
        let err = parse_args(&serve(), "host = \"h\"\nport = \"eighty\"\n", "f", |_| {
            false
        })
        .expect_err("bad value");
        assert!(
            err.starts_with("f:2: port: invalid value 'eighty'"),
            "{err}"
        );
        let err = parse_args(&serve(), "[serve]\nport = 1\n", "f", |_| false).expect_err("table");
        assert!(err.starts_with("f:1: unknown key `serve`"), "{err}");
        let err =
            parse_args(&serve(), "trust-proxy = \"yes\"\n", "f", |_| false).expect_err("switch");
        assert!(err.contains("f:1: `trust-proxy` is a switch"), "{err}");
        let err = parse_args(&serve(), "port = \n", "f", |_| false).expect_err("toml");
        assert!(err.starts_with("f is not valid TOML"), "{err}");
    }
}
