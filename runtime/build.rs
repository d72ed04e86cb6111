//! Build script: the commit `ac7 --version` names (`AC7_COMMIT`), read from git when the
//! source is a git checkout, `unknown commit` otherwise (a source archive, a container build
//! without `.git`, no `git` on the machine).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=AC7_COMMIT");
    let commit = std::env::var("AC7_COMMIT").ok().filter(|c| !c.is_empty());
    let commit = commit.or_else(|| {
        let hash = git(&["rev-parse", "--short=12", "HEAD"])?;
        // Rebuild when HEAD moves: HEAD itself, the branch it names, and packed refs.
        if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
            println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
            if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
            {
                let common = PathBuf::from(common);
                println!(
                    "cargo:rerun-if-changed={}",
                    common.join("packed-refs").display()
                );
                if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    println!("cargo:rerun-if-changed={}", common.join(branch).display());
                }
            }
        }
        Some(hash)
    });
    let commit = commit.unwrap_or_else(|| "unknown commit".to_owned());
    println!("cargo:rustc-env=AC7_COMMIT={commit}");
}
