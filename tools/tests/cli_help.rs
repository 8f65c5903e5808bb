//! `dmkit --help` and `dmkit bench --help`, pinned with insta: a renamed, added or removed
//! subcommand or a changed description shows up as a reviewed snapshot diff
//! (`tools/tests/snapshots/`). See docs/TESTING.md, "Format snapshots (insta)".

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dmkit"))
        .args(args)
        // Plain text whatever the terminal: no colours, clap's default width.
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .env("CLICOLOR", "0")
        .output()
        .expect("dmkit runs");
    assert!(out.status.success(), "dmkit {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

#[test]
fn dmkit_help() {
    insta::assert_snapshot!(help(&["--help"]));
}

#[test]
fn dmkit_bench_help() {
    insta::assert_snapshot!(help(&["bench", "--help"]));
}
