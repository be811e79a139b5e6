//! Integration tests of the `ferrofx` binary: every subcommand, with one bad-input case each.

use assert_cmd::Command;
use predicates::prelude::*;

fn ferrofx() -> Command {
    Command::cargo_bin("ferrofx").expect("the ferrofx binary is built")
}

#[test]
fn help_lists_the_subcommands() {
    ferrofx()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("demo").and(predicate::str::contains("train")));
}

#[test]
fn demo_trains_saves_reloads_and_reports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = ferrofx().args(["demo", "--quiet", "--out-dir"]).arg(dir.path()).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let pct = |label: &str| -> f64 {
        text.lines()
            .find(|l| l.contains(label))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.trim_end_matches('%').parse().ok())
            .unwrap_or_else(|| panic!("no '{label}' line in:\n{text}"))
    };
    for label in ["test accuracy (trained)", "test accuracy (optimised)", "test accuracy (reloaded)"] {
        assert!(pct(label) >= 97.0, "{label}: {}", pct(label));
    }
    assert_eq!(pct("reloaded = optimised"), 100.0);
    assert!(pct("optimised = eager predictions") >= 99.0);
    assert!(text.contains("2 BatchNorm folded, 1 dropout removed"), "{text}");
    assert!(text.contains("call_module[target=conv1]"), "the traced graph is printed: {text}");
    assert!(dir.path().join("digits_cnn.fxm").exists());
}

#[test]
fn train_writes_a_state_dict() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("w.safetensors");
    ferrofx()
        .args(["train", "--quiet", "--epochs", "1", "--out"])
        .arg(&file)
        .assert()
        .success()
        .stdout(predicate::str::contains("state dict written to"));
    let bytes = std::fs::read(&file).expect("state dict file");
    assert!(bytes.len() > 1000);
}

#[test]
fn train_rejects_bad_arguments() {
    ferrofx()
        .args(["train", "--quiet", "--epochs", "0"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--epochs must be at least 1"));
    ferrofx()
        .args(["train", "--quiet", "--test-fraction", "1.5"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--test-fraction must be in (0, 1), got 1.5"));
}

#[test]
fn train_reports_an_unwritable_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("no/such/dir/w.safetensors");
    ferrofx()
        .args(["train", "--quiet", "--epochs", "1", "--out"])
        .arg(&file)
        .assert()
        .failure()
        .stderr(predicate::str::contains("cannot write the state dict to"));
}

#[test]
fn unknown_subcommand_fails_with_usage() {
    ferrofx().arg("frobnicate").assert().failure().stderr(predicate::str::contains("unrecognized subcommand"));
}
